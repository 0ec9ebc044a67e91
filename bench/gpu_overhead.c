/* Host cost of Driver API calls, run once bare and once under LD_PRELOAD=libvgpu.so by
 * bench/gpu_overhead.py (real GPU) and bench/shim_overhead.py (fake driver, -DFAKE_DRIVER).
 * Entry points come from dlopen("libcuda.so.1") + dlsym, as the CUDA runtime gets them.
 * Prints one JSON line of ns/op. Usage: gpu_overhead [scale] [alloc]: scale multiplies the
 * iterations; "alloc" times only the 1 MiB alloc+free pair (a short run, for extra rounds).
 * alloc_free_ns is the median of blocks of 100 pairs: one slow driver call (a page-table grow, a
 * scheduler hiccup) moves a mean across processes far more than the shim does.
 * ctx_get_device_ns / ctx_get_current_ns are plain driver calls (passed through by the shim): what a
 * cuCtxGetDevice costs the memory wrappers, and whether a cuCtxGetCurrent-keyed cache would be cheaper. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define BLOCK 100
/* 1 MiB cuMemAlloc+cuMemFree pairs in blocks of BLOCK: the median block's ns per pair */
static int alloc_free_median(__typeof__(&cuMemAlloc_v2) alloc, __typeof__(&cuMemFree_v2) release, int pairs,
                             double *out)
{
    int nb = pairs / BLOCK > 0 ? pairs / BLOCK : 1, b, i;
    double *blk = malloc(sizeof *blk * nb), t0;
    CUdeviceptr p;

    if (!blk)
        return 1;
    for (i = 0; i < 50; i++) {
        CK(alloc(&p, 1 << 20));
        CK(release(p));
    }
    for (b = 0; b < nb; b++) {
        t0 = now_ns();
        for (i = 0; i < BLOCK; i++) {
            CK(alloc(&p, 1 << 20));
            CK(release(p));
        }
        blk[b] = (now_ns() - t0) / BLOCK;
    }
    qsort(blk, nb, sizeof *blk, cmp_double);
    *out = nb % 2 ? blk[nb / 2] : (blk[nb / 2 - 1] + blk[nb / 2]) / 2;
    free(blk);
    return 0;
}

/* an empty kernel, JIT-compiled by the driver for whatever GPU is there */
static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

int main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    int alloc_only = argc > 2 && !strcmp(argv[2], "alloc");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUdevice dev;
    CUcontext ctx;
    CUstream stream = NULL;
    CUfunction fn = NULL;
    CUdeviceptr p, *live;
    size_t f, t;
    int i, b, launches = (int)(256 * 400 * scale), pairs = (int)(2000 * scale), infos = (int)(20000 * scale);
    double t0, launch_ns = 0, alloc_ns, info_ns, getdev_ns, getcur_ns, free_ns[2];
    const int lives[2] = {10, 100000};

    if (!lib) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    GET(cuInit) GET(cuDeviceGet) GET(cuDevicePrimaryCtxRetain) GET(cuCtxSetCurrent) GET(cuMemAlloc_v2)
    GET(cuMemFree_v2) GET(cuMemGetInfo_v2) GET(cuLaunchKernel) GET(cuCtxGetDevice) GET(cuCtxGetCurrent)
    CK(p_cuInit(0));
    CK(p_cuDeviceGet(&dev, 0));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(p_cuCtxSetCurrent(ctx));
    if (alloc_only) {
        if (alloc_free_median(p_cuMemAlloc_v2, p_cuMemFree_v2, pairs, &alloc_ns))
            return 1;
        printf("{\"alloc_free_ns\": %.1f}\n", alloc_ns);
        return 0;
    }
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

    if (alloc_free_median(p_cuMemAlloc_v2, p_cuMemFree_v2, pairs, &alloc_ns))
        return 1;

    t0 = now_ns();
    for (i = 0; i < infos; i++)
        CK(p_cuMemGetInfo_v2(&f, &t));
    info_ns = (now_ns() - t0) / infos;

    {
        CUdevice d;
        CUcontext c;
        t0 = now_ns();
        for (i = 0; i < infos; i++)
            CK(p_cuCtxGetDevice(&d));
        getdev_ns = (now_ns() - t0) / infos;
        t0 = now_ns();
        for (i = 0; i < infos; i++)
            CK(p_cuCtxGetCurrent(&c));
        getcur_ns = (now_ns() - t0) / infos;
    }

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
    printf("{\"launch_ns\": %.2f, \"alloc_free_ns\": %.1f, \"meminfo_ns\": %.1f, \"ctx_get_device_ns\": %.1f, "
           "\"ctx_get_current_ns\": %.1f, \"pair_10_live_ns\": %.1f, \"pair_100k_live_ns\": %.1f}\n", launch_ns,
           alloc_ns, info_ns, getdev_ns, getcur_ns, free_ns[0], free_ns[1]);
    return 0;
}
