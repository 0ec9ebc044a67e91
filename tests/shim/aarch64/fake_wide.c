/* Linked into the aarch64 fake libcuda.so.1 next to tests/fake_driver/fake_cuda.c: gives the PASS
 * name cuDeviceGetLuid an argument list no real PASS entry has (10 integers: x0-x7 plus two on the
 * stack; 8 doubles: d0-d7; a 32-byte struct returned through x8), so one call proves the aarch64
 * trampoline and its slow path forward every kind of argument register. The shim never calls
 * cuDeviceGetLuid itself, and a trampoline needs no prototype, so the odd signature is harmless. */
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

struct wide_ret {
    unsigned long long tag, isum;
    double dsum;
    unsigned long long calls;
};

static unsigned long long wide_i[10];
static double wide_d[8];
static unsigned long long wide_calls;

EXPORT struct wide_ret cuDeviceGetLuid(unsigned long long a0, unsigned long long a1, unsigned long long a2,
                                       unsigned long long a3, unsigned long long a4, unsigned long long a5,
                                       unsigned long long a6, unsigned long long a7, unsigned long long a8,
                                       unsigned long long a9, double d0, double d1, double d2, double d3,
                                       double d4, double d5, double d6, double d7)
{
    const unsigned long long in[10] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9};
    const double din[8] = {d0, d1, d2, d3, d4, d5, d6, d7};
    struct wide_ret r = {0x77696465ull, 0, 0.0, 0};
    int i;

    memcpy(wide_i, in, sizeof wide_i);
    memcpy(wide_d, din, sizeof wide_d);
    for (i = 0; i < 10; i++)
        r.isum += in[i];
    for (i = 0; i < 8; i++)
        r.dsum += din[i];
    r.calls = ++wide_calls;
    return r;
}

EXPORT void fake_wide_args(unsigned long long i_out[10], double d_out[8])
{
    memcpy(i_out, wide_i, sizeof wide_i);
    memcpy(d_out, wide_d, sizeof wide_d);
}
