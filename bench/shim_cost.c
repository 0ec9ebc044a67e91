/* Driver of bench/limiter_launch.py, bench/region_attach.py and tests/region/test_region_cost.py
 * (not part of the shim): a plain CUDA driver-API program, run with LD_PRELOAD=libvgpu.so over the
 * fake driver (tests/fake_driver, linked with fake_events.c so the SM limiter is live).
 *   shim_cost launch N   cuLaunchKernel N times after one allocation (the region attached);
 *                        prints launches=, ns_per_launch=, extra_calls= (driver calls other than the
 *                        launches themselves, counted by the fake driver)
 *   shim_cost attach     reads one byte from stdin (a start gate), then times the first
 *                        cuMemAlloc (which attaches the region); prints first_alloc_us= */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static const char *const counted[] = {"cuCtxGetDevice", "cuCtxGetDevice_v2", "cuCtxGetCurrent", "cuStreamGetCtx",
                                      "cuStreamGetDevice", "cuDeviceGetCount", "cuDeviceGet", "cuMemAlloc_v2",
                                      "cuLaunchKernel", "cuEventSynchronize", "cuEventRecord", "cuEventQuery",
                                      "cuEventCreate", "cuEventElapsedTime", "cuEventElapsedTime_v2",
                                      "cuStreamIsCapturing", 0};

static unsigned long calls(void)
{
    unsigned long (*fc)(const char *) = (unsigned long (*)(const char *))dlsym(RTLD_DEFAULT, "fake_calls");
    unsigned long (*fe)(const char *) = (unsigned long (*)(const char *))dlsym(RTLD_DEFAULT, "fake_event_calls");
    unsigned long n = 0;
    int i;
    /* an entry point the fake driver counts itself (fake_calls; (unsigned long)-1 = not counted
     * there) or one of fake_events.c's (fake_event_calls): each call is counted exactly once */
    for (i = 0; counted[i]; i++) {
        unsigned long c = fc ? fc(counted[i]) : (unsigned long)-1;
        if (c == (unsigned long)-1)
            c = fe ? fe(counted[i]) : 0;
        n += c;
    }
    return n;
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    long long t0, t1;

    if (argc < 2 || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 2;
    if (!strcmp(argv[1], "attach")) {
        char c;
        if (read(0, &c, 1) < 0)
            return 2;
        t0 = now_ns();
        if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS)
            return 3;
        t1 = now_ns();
        printf("first_alloc_us=%.1f\n", (double)(t1 - t0) / 1e3);
        return 0;
    }
    if (!strcmp(argv[1], "launch") && argc == 3) {
        int i, n = atoi(argv[2]);
        unsigned long c0;
        if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS)
            return 3;
        for (i = 0; i < 1000; i++) /* warm up: events created, first measurement in */
            cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        c0 = calls();
        t0 = now_ns();
        for (i = 0; i < n; i++)
            cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        t1 = now_ns();
        printf("launches=%d ns_per_launch=%.1f extra_calls=%.3f\n", n, (double)(t1 - t0) / n,
               (double)(calls() - c0 - (unsigned long)n) / n);
        return 0;
    }
    return 2;
}
