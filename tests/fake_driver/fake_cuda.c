/* A fake libcuda.so.1 for the shim's tests: N devices of M MiB (FAKE_CUDA_DEVICES,
 * FAKE_CUDA_MEM_MB), contexts current per thread, streams, pools, VMM handles, arrays, and a
 * call counter per entry point (fake_calls("cuMemAlloc_v2")). FAKE_CUDA_LEGACY=1 makes the
 * CUDA 12.8+/13 queries (cuStreamGetDevice, cuCtxGetDevice_v2, pool location attributes) fail,
 * like an older driver. Build with -Wl,-Bsymbolic so addresses handed out are the fake's own. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#undef cuGetProcAddress

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 16
#define MAGIC_MEM 0x6d656d21u
#define MAGIC_CTX 0x63747821u
#define MAGIC_STREAM 0x73747221u
#define MAGIC_POOL 0x706f6f6cu

/* ---- call counters ---- */
#define COUNTED(X) \
    X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDriverGetVersion) X(cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxGetDevice_v2) \
    X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamGetCtx) \
    X(cuStreamGetDevice) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemCreate) X(cuMemRelease) X(cuMemPoolCreate) \
    X(cuMemPoolDestroy) X(cuMemPoolGetAttribute) X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) \
    X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuArrayDestroy) X(cuMipmappedArrayCreate) \
    X(cuMipmappedArrayDestroy) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2) X(cuLaunchKernel) \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel) \
    X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch) X(cuGraphLaunch_ptsz) X(cuGetProcAddress) \
    X(cuGetProcAddress_v2) X(cuMemcpyHtoD_v2)

enum {
#define X(n) C_##n,
    COUNTED(X)
#undef X
    NCOUNTED
};
static const char *const counted_name[] = {
#define X(n) #n,
    COUNTED(X)
#undef X
};
static unsigned long counts[NCOUNTED];
#define COUNT(n) __atomic_fetch_add(&counts[C_##n], 1, __ATOMIC_RELAXED)

EXPORT unsigned long fake_calls(const char *name)
{
    for (int i = 0; i < NCOUNTED; i++)
        if (strcmp(counted_name[i], name) == 0)
            return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
    return (unsigned long)-1;
}

EXPORT void fake_reset_calls(void)
{
    memset(counts, 0, sizeof counts);
}

/* ---- devices ---- */
static int ndev = 2;
static uint64_t dev_total = 1024ull << 20;
static uint64_t dev_used[MAXDEV];
static int legacy;
static int initialized;

__attribute__((constructor)) static void fake_config(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (s)
        ndev = atoi(s) < 0 ? 0 : atoi(s) > MAXDEV ? MAXDEV : atoi(s);
    s = getenv("FAKE_CUDA_MEM_MB");
    if (s)
        dev_total = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_LEGACY");
    legacy = s && s[0] == '1';
}

EXPORT unsigned long long fake_used(int dev)
{
    return (dev >= 0 && dev < MAXDEV) ? __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED) : 0;
}

/* ---- contexts (current per thread) and streams ---- */
struct CUctx_st {
    unsigned magic;
    int dev;
};
struct CUstream_st {
    unsigned magic;
    CUcontext ctx;
};
struct CUmemPoolHandle_st {
    unsigned magic;
    CUmemLocation loc;
};

static struct CUctx_st primary[MAXDEV];
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth; /* ctx_stack[ctx_depth - 1] is current */

static CUcontext current(void)
{
    return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

static int valid_ctx(CUcontext c)
{
    return c && c->magic == MAGIC_CTX;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    COUNT(cuInit);
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < MAXDEV; i++)
        primary[i] = (struct CUctx_st){MAGIC_CTX, i};
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

#define NEED_INIT() \
    do { \
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

EXPORT CUresult cuDriverGetVersion(int *v)
{
    COUNT(cuDriverGetVersion);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    COUNT(cuDeviceGetCount);
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    COUNT(cuDeviceGet);
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRetain);
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease_v2);
    return (dev < 0 || dev >= ndev) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    COUNT(cuCtxSetCurrent);
    if (c && !valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_depth)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pc)
{
    COUNT(cuCtxGetCurrent);
    if (!pc)
        return CUDA_ERROR_INVALID_VALUE;
    *pc = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    COUNT(cuCtxPushCurrent_v2);
    if (!valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pc)
{
    COUNT(cuCtxPopCurrent_v2);
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    if (pc)
        *pc = ctx_stack[ctx_depth];
    return CUDA_SUCCESS;
}

/* like the real driver: a thread with no current context gets CUDA_ERROR_INVALID_CONTEXT */
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    COUNT(cuCtxGetDevice);
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current()->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c)
{
    COUNT(cuCtxGetDevice_v2);
    if (legacy)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!c)
        c = current();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    struct CUstream_st *s;
    (void)flags;
    COUNT(cuStreamCreate);
    if (!ps)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    s = malloc(sizeof *s);
    s->magic = MAGIC_STREAM;
    s->ctx = current();
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    COUNT(cuStreamDestroy_v2);
    if (!s || s->magic != MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

static int special_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

static CUresult stream_ctx(CUstream s, CUcontext *out)
{
    if (special_stream(s)) {
        if (!current())
            return CUDA_ERROR_INVALID_CONTEXT;
        *out = current();
        return CUDA_SUCCESS;
    }
    if (s->magic != MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    COUNT(cuStreamGetCtx);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_ctx(s, pctx);
}

EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *d)
{
    CUcontext c;
    CUresult rc;
    COUNT(cuStreamGetDevice);
    if (legacy)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = stream_ctx(s, &c)) != CUDA_SUCCESS)
        return rc;
    *d = c->dev;
    return CUDA_SUCCESS;
}

/* ---- memory: a malloc'd header per allocation, its address is the "device pointer" ---- */
struct block {
    unsigned magic;
    int dev; /* -1: host */
    uint64_t size;
};

static CUresult take(int dev, uint64_t size, uint64_t *out)
{
    struct block *b;
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0) {
        uint64_t cur = __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED);
        do {
            if (size > dev_total - cur)
                return CUDA_ERROR_OUT_OF_MEMORY;
        } while (!__atomic_compare_exchange_n(&dev_used[dev], &cur, cur + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    }
    b = malloc(sizeof *b);
    b->magic = MAGIC_MEM;
    b->dev = dev;
    b->size = size;
    *out = (uint64_t)(uintptr_t)b;
    return CUDA_SUCCESS;
}

static CUresult give(uint64_t p)
{
    struct block *b = (struct block *)(uintptr_t)p;
    if (!p)
        return CUDA_SUCCESS;
    if (b->magic != MAGIC_MEM)
        return CUDA_ERROR_INVALID_VALUE;
    b->magic = 0;
    if (b->dev >= 0)
        __atomic_fetch_sub(&dev_used[b->dev], b->size, __ATOMIC_RELAXED);
    free(b);
    return CUDA_SUCCESS;
}

static CUresult alloc_current(CUdeviceptr *dptr, uint64_t size)
{
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((rc = take(current()->dev, size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    COUNT(cuMemAlloc_v2);
    return alloc_current(dptr, size);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    COUNT(cuMemFree_v2);
    return give(p);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int esz)
{
    size_t pp;
    CUresult rc;
    COUNT(cuMemAllocPitch_v2);
    if (!pitch || (esz != 4 && esz != 8 && esz != 16) || !w || !h)
        return CUDA_ERROR_INVALID_VALUE;
    pp = (w + 511) & ~(size_t)511;
    if ((rc = alloc_current(dptr, (uint64_t)pp * h)) == CUDA_SUCCESS)
        *pitch = pp;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    (void)flags;
    COUNT(cuMemAllocManaged);
    return alloc_current(dptr, size);
}

static CUresult alloc_on_stream(CUdeviceptr *dptr, size_t size, CUstream s)
{
    CUcontext c;
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = stream_ctx(s, &c)) != CUDA_SUCCESS)
        return rc;
    if ((rc = take(c->dev, size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    COUNT(cuMemAllocAsync);
    return alloc_on_stream(dptr, size, s);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    COUNT(cuMemAllocAsync_ptsz);
    return alloc_on_stream(dptr, size, s);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool)
{
    uint64_t p;
    CUresult rc;
    int dev;
    NEED_INIT();
    if (!dptr || !pool || pool->magic != MAGIC_POOL)
        return CUDA_ERROR_INVALID_VALUE;
    dev = pool->loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? pool->loc.id : -1;
    if ((rc = take(dev, size, &p)) == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    (void)s;
    COUNT(cuMemAllocFromPoolAsync);
    return alloc_from_pool(dptr, size, pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    (void)s;
    COUNT(cuMemAllocFromPoolAsync_ptsz);
    return alloc_from_pool(dptr, size, pool);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    COUNT(cuMemFreeAsync);
    return give(p);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    COUNT(cuMemFreeAsync_ptsz);
    return give(p);
}

static int location_dev(const CUmemLocation *loc, int *dev)
{
    switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (loc->id < 0 || loc->id >= ndev)
            return -1;
        *dev = loc->id;
        return 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        *dev = -1;
        return 0;
    default:
        return -1;
    }
}

/* VMM needs no context: the location names the device */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    int dev;
    uint64_t p;
    CUresult rc;
    (void)flags;
    COUNT(cuMemCreate);
    NEED_INIT();
    if (!h || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (location_dev(&prop->location, &dev) != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if ((rc = take(dev, size, &p)) == CUDA_SUCCESS)
        *h = p;
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    COUNT(cuMemRelease);
    return h ? give(h) : CUDA_ERROR_INVALID_VALUE;
}

static struct CUmemPoolHandle_st default_pool[MAXDEV];

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    int dev;
    struct CUmemPoolHandle_st *p;
    COUNT(cuMemPoolCreate);
    NEED_INIT();
    if (!pool || !props || location_dev(&props->location, &dev) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    p = malloc(sizeof *p);
    p->magic = MAGIC_POOL;
    p->loc = props->location;
    *pool = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    COUNT(cuMemPoolDestroy);
    if (!pool || pool->magic != MAGIC_POOL)
        return CUDA_ERROR_INVALID_VALUE;
    if (pool >= default_pool && pool < default_pool + MAXDEV)
        return CUDA_ERROR_INVALID_VALUE;
    pool->magic = 0;
    free(pool);
    return CUDA_SUCCESS;
}

static CUresult device_pool(CUmemoryPool *out, CUdevice dev)
{
    NEED_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    default_pool[dev].magic = MAGIC_POOL;
    default_pool[dev].loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    default_pool[dev].loc.id = dev;
    *out = &default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *out, CUdevice dev)
{
    COUNT(cuDeviceGetDefaultMemPool);
    return device_pool(out, dev);
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice dev)
{
    COUNT(cuDeviceGetMemPool);
    return device_pool(out, dev);
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    COUNT(cuMemPoolGetAttribute);
    if (!pool || pool->magic != MAGIC_POOL || !value)
        return CUDA_ERROR_INVALID_VALUE;
    if (legacy) /* drivers before CUDA 13 do not know the location attributes */
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_LOCATION_TYPE)
        *(int *)value = pool->loc.type;
    else if (attr == CU_MEMPOOL_ATTR_LOCATION_ID)
        *(int *)value = pool->loc.id;
    else
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

/* ---- arrays ---- */
static CUresult array_alloc(void *out, uint64_t w, uint64_t h, uint64_t d, unsigned ch)
{
    uint64_t p;
    CUresult rc;
    NEED_INIT();
    if (!out || !w || !ch)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    rc = take(current()->dev, w * (h ? h : 1) * (d ? d : 1) * ch, &p);
    if (rc == CUDA_SUCCESS)
        *(void **)out = (void *)(uintptr_t)p;
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    COUNT(cuArrayCreate_v2);
    return d ? array_alloc(a, d->Width, d->Height, 1, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    COUNT(cuArray3DCreate_v2);
    return d ? array_alloc(a, d->Width, d->Height, d->Depth, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    COUNT(cuArrayDestroy);
    return give((uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    COUNT(cuMipmappedArrayCreate);
    if (!d || !levels)
        return CUDA_ERROR_INVALID_VALUE;
    return array_alloc(a, d->Width * 2, d->Height, d->Depth, d->NumChannels);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    COUNT(cuMipmappedArrayDestroy);
    return give((uint64_t)(uintptr_t)a);
}

/* ---- VMM address space (enough for the GPU probe to dry-run here) ---- */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = 2u << 20;
    return CUDA_SUCCESS;
}

static uint64_t next_va = 0x7f0000000000ull;

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags)
{
    (void)align, (void)addr, (void)flags;
    if (!ptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    *ptr = __atomic_fetch_add(&next_va, (size + 0xfffff) & ~(uint64_t)0xfffff, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
    struct block *b = (struct block *)(uintptr_t)h;
    (void)offset, (void)flags;
    if (!ptr || !h || b->magic != MAGIC_MEM || size > b->size)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    CUcontext c;
    return stream_ctx(s, &c);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n)
{
    (void)v;
    return p && n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- modules: dummy handles, so the GPU benchmark can dry-run here ---- */
static int dummy_module, dummy_function;

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)&dummy_module;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    if (!f || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *f = (CUfunction)&dummy_function;
    return CUDA_SUCCESS;
}

/* ---- reporting ---- */
EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    int dev;
    COUNT(cuMemGetInfo_v2);
    NEED_INIT();
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current())
        return CUDA_ERROR_INVALID_CONTEXT;
    dev = current()->dev;
    *total_b = dev_total;
    *free_b = dev_total - __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    COUNT(cuDeviceTotalMem_v2);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = dev_total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    (void)dst;
    (void)src;
    (void)n;
    COUNT(cuMemcpyHtoD_v2);
    return CUDA_SUCCESS;
}

/* A PASS entry point with six integer arguments: the tests check every one of them survives the
 * trampoline's slow path (first call, before the slot is filled). */
static unsigned long long last_args[6];

EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int ui, size_t w, size_t h, CUstream s)
{
    last_args[0] = dst;
    last_args[1] = pitch;
    last_args[2] = ui;
    last_args[3] = w;
    last_args[4] = h;
    last_args[5] = (unsigned long long)(uintptr_t)s;
    return (CUresult)777;
}

EXPORT void fake_last_args(unsigned long long out[6])
{
    memcpy(out, last_args, sizeof last_args);
}

/* ---- launches: counted, nothing else ---- */
#define KPARAMS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
    unsigned shmem, CUstream s
#define UNUSED_K (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s

EXPORT CUresult cuLaunchKernel(KPARAMS, void **params, void **extra)
{
    UNUSED_K, (void)params, (void)extra;
    COUNT(cuLaunchKernel);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel_ptsz(KPARAMS, void **params, void **extra)
{
    UNUSED_K, (void)params, (void)extra;
    COUNT(cuLaunchKernel_ptsz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchCooperativeKernel(KPARAMS, void **params)
{
    UNUSED_K, (void)params;
    COUNT(cuLaunchCooperativeKernel);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(KPARAMS, void **params)
{
    UNUSED_K, (void)params;
    COUNT(cuLaunchCooperativeKernel_ptsz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)c, (void)f, (void)params, (void)extra;
    COUNT(cuLaunchKernelEx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)c, (void)f, (void)params, (void)extra;
    COUNT(cuLaunchKernelEx_ptsz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    (void)g, (void)s;
    COUNT(cuGraphLaunch);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    (void)g, (void)s;
    COUNT(cuGraphLaunch_ptsz);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress: (name, minimum cudaVersion) -> default / per-thread entry ---- */
struct proc {
    const char *name;
    int min_version;
    void *fn;
    void *fn_ptsz;
};

/* FAKE_CUDA_PROC_ALIASES=1: cuGetProcAddress hands out internal entry points (same behaviour,
 * other addresses than the exports), as a driver may */
static CUresult internal_alloc(CUdeviceptr *dptr, size_t size)
{
    return cuMemAlloc_v2(dptr, size);
}

static CUresult internal_launch_ptsz(KPARAMS, void **params, void **extra)
{
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static void *proc_alias(void *fn)
{
    static int aliases = -1;
    if (aliases < 0) {
        const char *e = getenv("FAKE_CUDA_PROC_ALIASES");
        aliases = e && e[0] == '1';
    }
    if (!aliases)
        return fn;
    if (fn == (void *)cuMemAlloc_v2)
        return (void *)internal_alloc;
    if (fn == (void *)cuLaunchKernel_ptsz)
        return (void *)internal_launch_ptsz;
    return fn;
}

EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);

static const struct proc procs[] = {
    {"cuInit", 2000, (void *)cuInit, NULL},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, NULL},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet, NULL},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, NULL},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2, NULL},
    {"cuMemFree", 3020, (void *)cuMemFree_v2, NULL},
    {"cuMemAllocPitch", 3020, (void *)cuMemAllocPitch_v2, NULL},
    {"cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, NULL},
    {"cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2, NULL},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2, NULL},
    {"cuMemCreate", 10020, (void *)cuMemCreate, NULL},
    {"cuMemRelease", 10020, (void *)cuMemRelease, NULL},
    {"cuMemAllocAsync", 11020, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz},
    {"cuLaunchKernel", 4000, (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", 11060, (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", 9000, (void *)cuLaunchCooperativeKernel, (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuGraphLaunch", 10000, (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz},
    {"cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, NULL},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, NULL},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain, NULL},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent, NULL},
    {"cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2, NULL},
};

static CUresult lookup(const char *name, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    CUdriverProcAddressQueryResult dummy;
    if (!st)
        st = &dummy;
    if (!name || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, name) != 0)
            continue;
        if (ver < procs[i].min_version) {
            *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = proc_alias(((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && procs[i].fn_ptsz)
                              ? procs[i].fn_ptsz
                              : procs[i].fn);
        *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *name, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st)
{
    COUNT(cuGetProcAddress_v2);
    return lookup(name, pfn, ver, flags, st);
}

EXPORT CUresult cuGetProcAddress(const char *name, void **pfn, int ver, cuuint64_t flags)
{
    COUNT(cuGetProcAddress);
    return lookup(name, pfn, ver, flags, NULL);
}
