/* Driver API probe for the GPU tests, run under LD_PRELOAD=libvgpu.so against the real driver.
 * Entry points come from dlopen("libcuda.so.1") + dlsym. Prints "key=value" lines.
 *   probe limit        cuMemGetInfo / cuDeviceTotalMem, then 512 MiB allocations until refused
 *   probe vmm          cuMemCreate (device and host-NUMA locations) + map, from a context-less thread
 *   probe async        cuMemAllocAsync / cuMemFreeAsync on a stream, from a context-less thread
 *   probe gpa          the CUDA runtime's path: every entry point from cuGetProcAddress_v2 (per-thread flags)
 *   probe steps        10 MiB stream-ordered allocations from the default pool (which keeps what is freed) until
 *                      refused: the pool's reserve now and at its highest */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>

#define SYM(name) static __typeof__(&name) p_##name;
#define LOAD(name) \
    if (!(p_##name = (__typeof__(&name))dlsym(lib, #name))) { printf("missing=%s\n", #name); return 2; }
#define FUNCS(X) X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuCtxGetDevice) \
    X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemCreate) X(cuMemRelease) \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) \
    X(cuMemSetAccess) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuStreamCreate) X(cuStreamSynchronize) \
    X(cuMemsetD8_v2) X(cuDeviceGetMemPool) X(cuMemPoolGetAttribute) X(cuMemPoolSetAttribute)
FUNCS(SYM)

static CUcontext ctx;
static CUstream stream;
static const size_t MiB = 1 << 20;

static void info(const char *tag)
{
    size_t f = 0, t = 0;
    CUresult rc = p_cuMemGetInfo_v2(&f, &t);
    printf("%s_rc=%d\n%s_free=%zu\n%s_total=%zu\n", tag, rc, tag, f, tag, t);
}

static int do_limit(void)
{
    CUdeviceptr ptrs[4096];
    size_t total = 0;
    int n = 0, i;
    CUresult rc = CUDA_SUCCESS;

    info("info");
    p_cuDeviceTotalMem_v2(&total, 0);
    printf("device_total=%zu\n", total);
    while (n < 4096 && (rc = p_cuMemAlloc_v2(&ptrs[n], 512 * MiB)) == CUDA_SUCCESS)
        n++;
    printf("allocated_512m=%d\nrefused_rc=%d\n", n, rc);
    info("full");
    for (i = 0; i < n; i++)
        p_cuMemFree_v2(ptrs[i]);
    info("freed");
    return 0;
}

static void *vmm_thread(void *arg)
{
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h, h2;
    CUmemAccessDesc acc;
    CUdeviceptr va;
    size_t gran = 0, size;
    CUdevice d;
    (void)arg;

    printf("thread_ctx_rc=%d\n", p_cuCtxGetDevice(&d));
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    printf("gran_rc=%d\n", p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size = ((3 * 1024 * MiB) + gran - 1) / gran * gran;
    printf("create_rc=%d\n", p_cuMemCreate(&h, size, &prop, 0));
    printf("create_over_rc=%d\n", p_cuMemCreate(&h2, size, &prop, 0)); /* 6 GiB > 4 GiB */
    printf("reserve_rc=%d\n", p_cuMemAddressReserve(&va, size, 0, 0, 0));
    printf("map_rc=%d\n", p_cuMemMap(va, size, 0, h, 0));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    printf("access_rc=%d\n", p_cuMemSetAccess(va, size, &acc, 1));
    printf("unmap_rc=%d\n", p_cuMemUnmap(va, size));
    p_cuMemAddressFree(va, size);
    printf("release_rc=%d\n", p_cuMemRelease(h));
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; /* not device memory: never charged */
    prop.location.id = 0;
    printf("numa_create_rc=%d\n", p_cuMemCreate(&h2, 2 * MiB, &prop, 0));
    return NULL;
}

static void *async_thread(void *arg)
{
    CUdeviceptr a, b;
    CUdevice d;
    (void)arg;

    printf("thread_ctx_rc=%d\n", p_cuCtxGetDevice(&d));
    printf("async_rc=%d\n", p_cuMemAllocAsync(&a, 3 * 1024 * MiB, stream));
    printf("async_over_rc=%d\n", p_cuMemAllocAsync(&b, 3 * 1024 * MiB, stream));
    printf("free_async_rc=%d\n", p_cuMemFreeAsync(a, stream));
    printf("sync_rc=%d\n", p_cuStreamSynchronize(stream));
    printf("async_again_rc=%d\n", p_cuMemAllocAsync(&b, 3 * 1024 * MiB, stream));
    p_cuMemFreeAsync(b, stream);
    p_cuStreamSynchronize(stream);
    return NULL;
}

static int do_steps(CUdevice dev)
{
    CUdeviceptr p[1024];
    CUmemoryPool pool;
    cuuint64_t keep = ~0ull, now = 0, high = 0;
    int n = 0;
    CUresult rc = CUDA_SUCCESS;

    p_cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    p_cuDeviceGetMemPool(&pool, dev);
    p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    while (n < 1024 && (rc = p_cuMemAllocAsync(&p[n], 10 * MiB, stream)) == CUDA_SUCCESS)
        n++;
    p_cuStreamSynchronize(stream);
    p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now);
    p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
    printf("steps_allocated=%d\nsteps_refused_rc=%d\npool_reserved=%llu\npool_reserved_high=%llu\n", n, rc,
           (unsigned long long)now, (unsigned long long)high);
    info("steps");
    while (n--)
        p_cuMemFreeAsync(p[n], stream);
    p_cuStreamSynchronize(stream);
    return 0;
}

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static int do_gpa(void *lib)
{
    gpa_t gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2");
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    CUresult (*alloc)(CUdeviceptr *, size_t), (*afree)(CUdeviceptr), (*info)(size_t *, size_t *);
    CUresult (*aasync)(CUdeviceptr *, size_t, CUstream), (*launch)(CUfunction, unsigned, unsigned, unsigned,
                                                                   unsigned, unsigned, unsigned, unsigned, CUstream,
                                                                   void **, void **);
    CUdriverProcAddressQueryResult st;
    CUdeviceptr p[16], a;
    size_t f = 0, t = 0;
    Dl_info di;
    int n = 0;
    CUresult rc;

    if (!gpa)
        return 2;
    gpa("cuMemAlloc", (void **)&alloc, CUDA_VERSION, ptds, &st);
    gpa("cuMemFree", (void **)&afree, CUDA_VERSION, ptds, &st);
    gpa("cuMemGetInfo", (void **)&info, CUDA_VERSION, ptds, &st);
    gpa("cuMemAllocAsync", (void **)&aasync, CUDA_VERSION, ptds, &st);
    gpa("cuLaunchKernel", (void **)&launch, CUDA_VERSION, ptds, &st);
    printf("launch_in_shim=%d\n", launch && dladdr((void *)launch, &di) && strstr(di.dli_fname, "libvgpu") != NULL);
    printf("async_in_shim=%d\n", aasync && dladdr((void *)aasync, &di) && strstr(di.dli_fname, "libvgpu") != NULL);
    info(&f, &t);
    printf("gpa_total=%zu\n", t);
    while (n < 16 && (rc = alloc(&p[n], 1024 * MiB)) == CUDA_SUCCESS)
        n++;
    printf("gpa_allocated_1g=%d\ngpa_refused_rc=%d\n", n, rc);
    printf("gpa_async_over_rc=%d\n", aasync(&a, 1024 * MiB, CU_STREAM_PER_THREAD));
    while (n--)
        afree(p[n]);
    return 0;
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUdevice dev;
    pthread_t t;

    if (!lib || argc < 2) {
        printf("error=no libcuda or no mode\n");
        return 2;
    }
    FUNCS(LOAD)
    printf("init_rc=%d\n", p_cuInit(0));
    p_cuDeviceGet(&dev, 0);
    p_cuDevicePrimaryCtxRetain(&ctx, dev);
    p_cuCtxSetCurrent(ctx);
    if (!strcmp(argv[1], "limit"))
        return do_limit();
    if (!strcmp(argv[1], "gpa"))
        return do_gpa(lib);
    if (!strcmp(argv[1], "steps"))
        return do_steps(dev);
    if (!strcmp(argv[1], "vmm")) {
        pthread_create(&t, NULL, vmm_thread, NULL);
        pthread_join(t, NULL);
        info("after");
        return 0;
    }
    if (!strcmp(argv[1], "async")) {
        p_cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
        pthread_create(&t, NULL, async_thread, NULL);
        pthread_join(t, NULL);
        info("after");
        return 0;
    }
    return 2;
}
