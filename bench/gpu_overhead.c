/* Host cost of Driver API calls, run once bare and once under LD_PRELOAD=libvgpu.so by
 * bench/gpu_overhead.py (real GPU) and bench/shim_overhead.py (fake driver, -DFAKE_DRIVER).
 * Entry points come from dlopen("libcuda.so.1") + dlsym, as the CUDA runtime gets them.
 * Prints one JSON line of ns/op. Usage: gpu_overhead [scale] (scale multiplies the iterations). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda.h>

#define GET(name) \
    __typeof__(&name) p_##name = (__typeof__(&name))dlsym(lib, #name); \
    if (!p_##name) { fprintf(stderr, "missing %s\n", #name); return 2; }
#define CK(call) \
    do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) { fprintf(stderr, "%s = %d at line %d\n", #call, rc_, __LINE__); return 1; } } while (0)

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* an empty kernel, JIT-compiled by the driver for whatever GPU is there */
static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

int main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUdevice dev;
    CUcontext ctx;
    CUstream stream = NULL;
    CUfunction fn = NULL;
    CUdeviceptr p, *live;
    size_t f, t;
    int i, b, launches = (int)(256 * 400 * scale), pairs = (int)(2000 * scale), infos = (int)(20000 * scale);
    double t0, launch_ns = 0, alloc_ns, info_ns, free_ns[2];
    const int lives[2] = {10, 100000};

    if (!lib) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    GET(cuInit) GET(cuDeviceGet) GET(cuDevicePrimaryCtxRetain) GET(cuCtxSetCurrent) GET(cuMemAlloc_v2)
    GET(cuMemFree_v2) GET(cuMemGetInfo_v2) GET(cuLaunchKernel)
    CK(p_cuInit(0));
    CK(p_cuDeviceGet(&dev, 0));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(p_cuCtxSetCurrent(ctx));
#ifndef FAKE_DRIVER
    {
        GET(cuModuleLoadData) GET(cuModuleGetFunction) GET(cuStreamCreate) GET(cuStreamSynchronize)
        CUmodule mod;
        CK(p_cuModuleLoadData(&mod, ptx));
        CK(p_cuModuleGetFunction(&fn, mod, "noop"));
        CK(p_cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        /* batches of 256 then a sync: the queue never fills, so we time the host side only */
        for (b = 0; b < launches / 256 + 4; b++) {
            t0 = now_ns();
            for (i = 0; i < 256; i++)
                CK(p_cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            if (b >= 4) /* the first batches warm up */
                launch_ns += now_ns() - t0;
            CK(p_cuStreamSynchronize(stream));
        }
    }
#else
    (void)ptx;
    for (b = 0; b < launches / 256 + 4; b++) {
        t0 = now_ns();
        for (i = 0; i < 256; i++)
            CK(p_cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        if (b >= 4)
            launch_ns += now_ns() - t0;
    }
#endif
    launch_ns /= (launches / 256) * 256;

    for (i = 0; i < 50; i++) { CK(p_cuMemAlloc_v2(&p, 1 << 20)); CK(p_cuMemFree_v2(p)); }
    t0 = now_ns();
    for (i = 0; i < pairs; i++) {
        CK(p_cuMemAlloc_v2(&p, 1 << 20));
        CK(p_cuMemFree_v2(p));
    }
    alloc_ns = (now_ns() - t0) / pairs;

    t0 = now_ns();
    for (i = 0; i < infos; i++)
        CK(p_cuMemGetInfo_v2(&f, &t));
    info_ns = (now_ns() - t0) / infos;

    /* alloc+free of 4 KiB with 10 vs 100,000 other allocations alive: O(1) free stays flat */
    live = malloc(sizeof *live * lives[1]);
    for (int k = 0; k < 2; k++) {
        for (i = 0; i < lives[k]; i++)
            CK(p_cuMemAlloc_v2(&live[i], 4096));
        t0 = now_ns();
        for (i = 0; i < pairs; i++) {
            CK(p_cuMemAlloc_v2(&p, 4096));
            CK(p_cuMemFree_v2(p));
        }
        free_ns[k] = (now_ns() - t0) / pairs;
        for (i = 0; i < lives[k]; i++)
            CK(p_cuMemFree_v2(live[i]));
    }
#ifndef FAKE_DRIVER
    {
        GET(cuCtxSynchronize)
        CK(p_cuCtxSynchronize());
    }
#endif
    printf("{\"launch_ns\": %.2f, \"alloc_free_ns\": %.1f, \"meminfo_ns\": %.1f, \"pair_10_live_ns\": %.1f, "
           "\"pair_100k_live_ns\": %.1f}\n", launch_ns, alloc_ns, info_ns, free_ns[0], free_ns[1]);
    return 0;
}
