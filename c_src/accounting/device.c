/* Device resolution. Never indexes anything with an id the driver did not vouch for. */
#include <stddef.h>
#include <stdio.h>

#include "accounting/device.h"
#include "accounting/table.h"
#include "driver/real.h"

/* Pool location attributes by value (CUDA 13 numbering): they entered cuda.h during 13.x, so 12.x and
 * early 13.0 headers lack the names. A driver that does not know them answers an error, which we handle. */
#define POOL_ATTR_LOCATION_ID ((CUmemPool_attribute)11)
#define POOL_ATTR_LOCATION_TYPE ((CUmemPool_attribute)12)
/* CUmemLocationType values (host NUMA kinds arrived in CUDA 12.2) */
enum { LOC_DEVICE = 1, LOC_HOST = 2, LOC_HOST_NUMA = 3, LOC_HOST_NUMA_CURRENT = 4 };

static int device_count = -1; /* cached after cuInit; -1 = not known yet */

/* bound is the driver's device count once known, VGPU_MAX_DEVICES before */
VGPU_HIDDEN int vgpu_dev_check(long long dev)
{
    int n = __atomic_load_n(&device_count, __ATOMIC_RELAXED);

    if (n < 0) {
        int c = 0;
        if (REAL(cuDeviceGetCount)(&c) == CUDA_SUCCESS && c >= 0) {
            n = c < VGPU_MAX_DEVICES ? c : VGPU_MAX_DEVICES;
            __atomic_store_n(&device_count, n, __ATOMIC_RELAXED);
        } else {
            n = VGPU_MAX_DEVICES;
        }
    }
    return (dev >= 0 && dev < n) ? (int)dev : VGPU_DEV_UNKNOWN;
}

VGPU_HIDDEN void vgpu_dev_forget_count(void)
{
    __atomic_store_n(&device_count, -1, __ATOMIC_RELAXED);
}

VGPU_HIDDEN int vgpu_dev_current(void)
{
    CUdevice d = -1;

    if (REAL(cuCtxGetDevice)(&d) != CUDA_SUCCESS) /* no current context: nothing to charge */
        return VGPU_DEV_UNKNOWN;
    return vgpu_dev_check(d);
}

/* True when the driver reports exactly one device (count cached after cuInit; unknown counts as many). */
VGPU_HIDDEN int vgpu_dev_single(void)
{
    return vgpu_dev_check(1) < 0 && vgpu_dev_check(0) == 0;
}

/* The device of this thread's current context, for callers that know a context is current (a call
 * that needed one succeeded) or that tolerate a guess of device 0 when none is: with a single
 * device no cuCtxGetDevice is made (the one driver call a hot wrapper would add). Nothing is cached
 * per context, so nothing goes stale when contexts come and go. */
VGPU_HIDDEN int vgpu_dev_of_current_ctx(void)
{
    return vgpu_dev_single() ? 0 : vgpu_dev_current();
}

VGPU_HIDDEN int vgpu_dev_from_location(const CUmemLocation *loc)
{
    if (!loc)
        return VGPU_DEV_UNKNOWN;
    switch ((int)loc->type) {
    case LOC_DEVICE:
        return vgpu_dev_check(loc->id);
    case LOC_HOST:
    case LOC_HOST_NUMA:
    case LOC_HOST_NUMA_CURRENT:
        return VGPU_DEV_HOST;
    default:
        return VGPU_DEV_UNKNOWN;
    }
}

/* a driver entry point newer than our surface (not exported by us), looked up once; NULL if absent */
static void *optional_sym(void **cache, const char *name)
{
    void *p = __atomic_load_n(cache, __ATOMIC_RELAXED);

    if (!p) {
        vgpu_lib_init(VGPU_LIB_CUDA);
        p = vgpu_lib_handle(VGPU_LIB_CUDA) ? vgpu_resolve(name, VGPU_LIB_CUDA, 0) : NULL;
        if (!p)
            p = (void *)-1;
        __atomic_store_n(cache, p, __ATOMIC_RELAXED);
    }
    return p == (void *)-1 ? NULL : p;
}

/* the device of a context without making it current on this thread */
static int dev_of_ctx(CUcontext ctx)
{
    static void *get_v2_cache;
    void *get_v2 = optional_sym(&get_v2_cache, "cuCtxGetDevice_v2"); /* CUDA 12.8+ */
    CUdevice d = -1;
    CUcontext popped;
    CUresult rc;

    if (get_v2 && ((CUresult(*)(CUdevice *, CUcontext))get_v2)(&d, ctx) == CUDA_SUCCESS)
        return vgpu_dev_check(d);
    if (REAL(cuCtxPushCurrent_v2)(ctx) != CUDA_SUCCESS)
        return VGPU_DEV_UNKNOWN;
    rc = REAL(cuCtxGetDevice)(&d);
    REAL(cuCtxPopCurrent_v2)(&popped);
    return rc == CUDA_SUCCESS ? vgpu_dev_check(d) : VGPU_DEV_UNKNOWN;
}

VGPU_HIDDEN int vgpu_dev_from_stream(CUstream stream)
{
    static void *get_dev_cache, *get_ctx_cache;
    void *get_dev = optional_sym(&get_dev_cache, "cuStreamGetDevice"); /* CUDA 12.8+ */
    void *get_ctx;
    CUdevice d = -1;
    CUcontext ctx = NULL;

    if (get_dev && ((CUresult(*)(CUstream, CUdevice *))get_dev)(stream, &d) == CUDA_SUCCESS)
        return vgpu_dev_check(d);
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return vgpu_dev_current();
    get_ctx = optional_sym(&get_ctx_cache, "cuStreamGetCtx");
    if (!get_ctx || ((CUresult(*)(CUstream, CUcontext *))get_ctx)(stream, &ctx) != CUDA_SUCCESS || !ctx)
        return VGPU_DEV_UNKNOWN;
    return dev_of_ctx(ctx);
}

VGPU_HIDDEN int vgpu_dev_from_pool(CUmemoryPool pool, CUstream stream)
{
    int type = 0, id = -1, dev;
    uint64_t unused;

    if (!pool)
        return vgpu_dev_from_stream(stream);
    /* pools we saw created (or asked for) are in the table: no driver call on the hot path */
    if (vgpu_table_get((uint64_t)(uintptr_t)pool, VGPU_K_POOL, &dev, &unused))
        return dev;
    /* an imported pool: its own location (CUDA 13 attributes), remembered for next time */
    if (REAL(cuMemPoolGetAttribute)(pool, POOL_ATTR_LOCATION_TYPE, &type) == CUDA_SUCCESS &&
        REAL(cuMemPoolGetAttribute)(pool, POOL_ATTR_LOCATION_ID, &id) == CUDA_SUCCESS) {
        CUmemLocation loc = {.type = (CUmemLocationType)type, .id = id};
        dev = vgpu_dev_from_location(&loc);
        vgpu_table_put((uint64_t)(uintptr_t)pool, VGPU_K_POOL, dev, 0);
        return dev;
    }
    return vgpu_dev_from_stream(stream);
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi and NVML print it; 0 on success */
VGPU_HIDDEN int vgpu_dev_uuid(int ordinal, char *out, size_t n)
{
    CUdevice dev;
    CUuuid u;
    const unsigned char *b = (const unsigned char *)u.bytes;

    if (REAL(cuDeviceGet)(&dev, ordinal) != CUDA_SUCCESS || REAL(cuDeviceGetUuid_v2)(&u, dev) != CUDA_SUCCESS)
        return -1;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return 0;
}
