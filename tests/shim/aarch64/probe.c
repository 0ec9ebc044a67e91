/* Runtime probe for the aarch64 shim under qemu-aarch64: linked against the fake libcuda.so.1,
 * run with the shim in LD_PRELOAD. argv[1] picks the very first call into the shim (the one that
 * takes a trampoline's slow path): "wide" (cuDeviceGetLuid as redefined by fake_wide.c) or
 * "count" (cuDeviceGetCount, before cuInit); "race" makes 16 threads' first calls at once and stops.
 * Prints key=value lines for the test to compare. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct wide_ret {
    unsigned long long tag, isum;
    double dsum;
    unsigned long long calls;
};
typedef struct wide_ret (*wide_fn)(unsigned long long, unsigned long long, unsigned long long, unsigned long long,
                                   unsigned long long, unsigned long long, unsigned long long, unsigned long long,
                                   unsigned long long, unsigned long long, double, double, double, double, double,
                                   double, double, double);
typedef void (*wide_args_fn)(unsigned long long[10], double[8]);
typedef unsigned long (*calls_fn)(const char *);
typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_handle_fn)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_mem_fn)(nvmlDevice_t, nvmlMemory_t *);

static const char *where(void *p)
{
    Dl_info i;
    if (!p)
        return "NULL";
    if (!dladdr(p, &i) || !i.dli_fname)
        return "?";
    return strrchr(i.dli_fname, '/') ? strrchr(i.dli_fname, '/') + 1 : i.dli_fname;
}

/* NVML: init and handle through the global scope (the shim's PASS trampolines, whose NVML slots
 * are still empty: slow path), memory info by dlsym on the handle (the shim's wrapper) */
static void *global_or(void *h, const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    return p ? p : dlsym(h, name);
}

static void nvml(void)
{
    void *nh = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvml_init_fn init = nh ? (nvml_init_fn)global_or(nh, "nvmlInit_v2") : NULL;
    nvml_handle_fn get = nh ? (nvml_handle_fn)global_or(nh, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    nvml_mem_fn mem = nh ? (nvml_mem_fn)dlsym(nh, "nvmlDeviceGetMemoryInfo") : NULL;
    nvmlDevice_t d;
    nvmlMemory_t m = {0, 0, 0};
    nvmlReturn_t rc;

    if (!init || !get || !mem) {
        printf("nvml_setup=0\n");
        return;
    }
    printf("nvml_init_at=%s nvml_init=%d", where((void *)init), init());
    printf(" nvml_handle=%d", get(0, &d));
    rc = mem(d, &m);
    printf(" nvml_mem=%d nvml_total=%llu nvml_mem_at=%s\n", rc, m.total, where((void *)mem));
}

/* every argument distinct and wide enough that a lost or swapped register shows */
static void wide(const char *label, wide_fn fn, wide_args_fn args)
{
    unsigned long long got_i[10];
    double got_d[8];
    struct wide_ret r = fn(0x1010101010101010ull, 0x2020202020202021ull, 0x3030303030303032ull,
                           0x4040404040404043ull, 0x5050505050505054ull, 0x6060606060606065ull,
                           0x7070707070707076ull, 0x0808080808080807ull, 0x0909090909090908ull,
                           0x0a0a0a0a0a0a0a09ull, 1.5, -2.25, 3.125, 1e10, -5e-3, 6.0, 7.75, 1024.5);
    int i, ok_i = 1, ok_d = 1;

    args(got_i, got_d);
    ok_i &= got_i[0] == 0x1010101010101010ull && got_i[7] == 0x0808080808080807ull;
    ok_i &= got_i[8] == 0x0909090909090908ull && got_i[9] == 0x0a0a0a0a0a0a0a09ull; /* the stack pair */
    for (i = 1; i < 7; i++)
        ok_i &= got_i[i] == 0x1010101010101010ull * (unsigned long long)(i + 1) + (unsigned long long)i;
    ok_d = got_d[0] == 1.5 && got_d[1] == -2.25 && got_d[2] == 3.125 && got_d[3] == 1e10 && got_d[4] == -5e-3 &&
           got_d[5] == 6.0 && got_d[6] == 7.75 && got_d[7] == 1024.5;
    printf("%s_ints=%d %s_doubles=%d %s_tag=%llx %s_dsum=%.4f %s_calls=%llu\n", label, ok_i, label, ok_d, label,
           r.tag, label, r.dsum, label, r.calls);
}

/* "race": every thread's first call lands in an empty slot at the same moment */
#define NTHREADS 16
static pthread_barrier_t go;
static CUresult race_rc[NTHREADS][3];

static void *first_calls(void *arg)
{
    long i = (long)arg;
    int n = 0;
    CUdevice d;

    pthread_barrier_wait(&go);
    race_rc[i][0] = (i & 1) ? cuInit(0) : cuDeviceGetCount(&n);
    race_rc[i][1] = cuInit(0);
    race_rc[i][2] = cuDeviceGet(&d, 0);
    return NULL;
}

static int race(void)
{
    pthread_t t[NTHREADS];
    long i;
    int bad = 0;

    pthread_barrier_init(&go, NULL, NTHREADS);
    for (i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, first_calls, (void *)i);
    for (i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    for (i = 0; i < NTHREADS; i++)
        bad += ((i & 1) ? race_rc[i][0] != 0 : (race_rc[i][0] != 0 && race_rc[i][0] != 3)) || race_rc[i][1] != 0 ||
               race_rc[i][2] != 0;
    printf("race_bad=%d\n", bad);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "count";
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    wide_fn wfn = (wide_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetLuid"); /* the shim's trampoline */
    wide_args_fn wargs = (wide_args_fn)dlsym(h, "fake_wide_args");
    calls_fn calls = (calls_fn)dlsym(h, "fake_calls");
    unsigned long long a[6];
    void (*last_args)(unsigned long long[6]) = (void (*)(unsigned long long[6]))dlsym(h, "fake_last_args");
    int n = -1;
    CUcontext ctx = 0;
    CUdeviceptr p1 = 0, p2 = 0, p3 = 0;
    size_t fr = 0, tot = 0;
    CUresult rc;
    void *gpa = NULL;
    CUdriverProcAddressQueryResult st;

    if (!h || !wfn || !wargs || !calls || !last_args) {
        printf("setup_failed=%s\n", dlerror());
        return 1;
    }
    printf("wide_at=%s\n", where((void *)wfn));
    if (strcmp(mode, "race") == 0)
        return race();
    if (strcmp(mode, "wide") == 0) {
        wide("first", wfn, wargs);
    } else {
        rc = cuDeviceGetCount(&n);
        printf("first_count_rc=%d\n", rc);
    }
    printf("init=%d\n", cuInit(0));
    rc = cuDeviceGetCount(&n);
    printf("count_rc=%d count=%d\n", rc, n);
    wide("again", wfn, wargs);

    rc = cuMemsetD2D32Async(0x1111222233334444ull, 0x5555, 0x66667777u, 0x8888, 0x9999, (CUstream)0xabcdef);
    last_args(a);
    printf("memset_rc=%d memset_args=%llx,%llx,%llx,%llx,%llx,%llx\n", rc, a[0], a[1], a[2], a[3], a[4], a[5]);

    printf("retain=%d", cuDevicePrimaryCtxRetain(&ctx, 0));
    printf(" set=%d\n", cuCtxSetCurrent(ctx));
    rc = cuMemGetInfo_v2(&fr, &tot);
    printf("info_rc=%d free=%zu total=%zu\n", rc, fr, tot);
    printf("alloc1=%d", cuMemAlloc_v2(&p1, 48u << 20));
    printf(" alloc2=%d", cuMemAlloc_v2(&p2, 48u << 20));
    rc = cuMemGetInfo_v2(&fr, &tot);
    printf(" info2_rc=%d free2=%zu", rc, fr);
    printf(" free1=%d", cuMemFree_v2(p1));
    printf(" alloc3=%d", cuMemAlloc_v2(&p3, 48u << 20));
    printf(" free3=%d\n", cuMemFree_v2(p3));

    rc = cuLaunchKernel((CUfunction)0x1234, 1, 2, 3, 4, 5, 6, 7, (CUstream)0, NULL, NULL);
    printf("launch_rc=%d launch_calls=%lu\n", rc, calls("cuLaunchKernel"));

    rc = cuGetProcAddress_v2("cuMemAlloc", &gpa, 12000, 0, &st);
    printf("gpa_rc=%d gpa=%s\n", rc, where(gpa));
    printf("h_alloc=%s h_pass=%s default_alloc=%s\n", where(dlsym(h, "cuMemAlloc_v2")), where(dlsym(h, "cuDeviceGet")),
           where(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")));
    printf("next_alloc=%s next_fake=%s next_missing=%s\n", where(dlsym(RTLD_NEXT, "cuMemAlloc_v2")),
           where(dlsym(RTLD_NEXT, "fake_calls")), where(dlsym(RTLD_NEXT, "no_such_symbol_anywhere")));
    printf("next_puts_is_libc=%d\n",
           dlsym(RTLD_NEXT, "puts") != NULL && dlsym(RTLD_NEXT, "puts") == dlsym(RTLD_DEFAULT, "puts"));
    nvml();
    return 0;
}
