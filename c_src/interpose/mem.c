/* Wrappers of the linear allocators: cuMemAlloc, pitch, managed, stream-ordered and pools.
 * Each one: resolve real -> pick the device from the arguments -> charge -> call -> settle. */
#include <stdint.h>

#include <cuda.h>

#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/device.h"
#include "accounting/table.h"
#include "driver/real.h"

#define KEY(p) ((uint64_t)(uintptr_t)(p))

/* Charge an allocation made in this thread's current context. With a single visible device (the
 * driver's count, cached after cuInit) it can only land on device 0, so no cuCtxGetDevice on the
 * hot path (vgpu_dev_of_current_ctx). Without a current context the real call fails
 * and vgpu_settle gives the charge back; if the charge is refused, the real query decides, so a
 * context-less call still gets the driver's own error, never OUT_OF_MEMORY. */
static CUresult charge_current(int *dev, uint64_t bytes)
{
    int single = vgpu_dev_single();
    CUresult rc;

    *dev = vgpu_dev_of_current_ctx();
    rc = vgpu_charge(*dev, bytes);
    if (VGPU_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY && single) && vgpu_dev_current() < 0) {
        *dev = VGPU_DEV_UNKNOWN; /* no context: nothing to charge, the driver answers */
        rc = CUDA_SUCCESS;
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);
    int dev;
    CUresult rc = charge_current(&dev, bytesize);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, bytesize);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, dev, bytesize);
    return rc;
}
VGPU_OWN_ALIAS(cuMemAlloc_v2)

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    __typeof__(&cuMemFree_v2) real = REAL(cuMemFree_v2);
    struct vgpu_tracked t = vgpu_untrack(dptr, VGPU_K_DPTR);
    CUresult rc = real(dptr);

    vgpu_untrack_done(rc, dptr, VGPU_K_DPTR, t);
    return rc;
}
VGPU_OWN_ALIAS(cuMemFree_v2)

/* The pitch is known only after the call: charge width*height first (never divides by the
 * element size, which may be 0), then settle the difference with the real pitch*height. */
VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                        unsigned int ElementSizeBytes)
{
    __typeof__(&cuMemAllocPitch_v2) real = REAL(cuMemAllocPitch_v2);
    int dev;
    uint64_t est = vgpu_mul_sat(WidthInBytes, Height), actual;
    CUresult rc = charge_current(&dev, est);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS || dev < 0) {
        vgpu_settle(rc, 0, VGPU_K_DPTR, dev, est);
        return rc;
    }
    actual = pPitch ? vgpu_mul_sat(*pPitch, Height) : est;
    if (actual > est && vgpu_budget_reserve(dev, actual - est) != 0) {
        REAL(cuMemFree_v2)(*dptr); /* padding pushed it over the limit */
        vgpu_budget_release(dev, est);
        *dptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < est)
        vgpu_budget_release(dev, est - actual);
    vgpu_settle(CUDA_SUCCESS, *dptr, VGPU_K_DPTR, dev, actual);
    return CUDA_SUCCESS;
}
VGPU_OWN_ALIAS(cuMemAllocPitch_v2)

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    __typeof__(&cuMemAllocManaged) real = REAL(cuMemAllocManaged);
    int dev;
    CUresult rc = charge_current(&dev, bytesize);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, bytesize, flags);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, dev, bytesize);
    return rc;
}
VGPU_OWN_ALIAS(cuMemAllocManaged)

/* ---- stream-ordered: the device comes from the stream / pool, never from this thread's context ---- */
static CUresult alloc_async(__typeof__(&cuMemAllocAsync) real, CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    int dev = vgpu_dev_from_stream(s);
    CUresult rc = vgpu_charge(dev, bytesize);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, bytesize, s);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, dev, bytesize);
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(REAL(cuMemAllocAsync), dptr, bytesize, hStream);
}
VGPU_OWN_ALIAS(cuMemAllocAsync)

VGPU_HIDDEN CUresult vgpu_own_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(vgpu_var_fn(VGPU_VAR_cuMemAllocAsync_ptsz), dptr, bytesize, hStream);
}

static CUresult alloc_pool(__typeof__(&cuMemAllocFromPoolAsync) real, CUdeviceptr *dptr, size_t bytesize,
                           CUmemoryPool pool, CUstream s)
{
    int dev = vgpu_dev_from_pool(pool, s);
    CUresult rc = vgpu_charge(dev, bytesize);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, bytesize, pool, s);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, dev, bytesize);
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return alloc_pool(REAL(cuMemAllocFromPoolAsync), dptr, bytesize, pool, hStream);
}
VGPU_OWN_ALIAS(cuMemAllocFromPoolAsync)

VGPU_HIDDEN CUresult vgpu_own_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                           CUstream hStream)
{
    return alloc_pool(vgpu_var_fn(VGPU_VAR_cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool, hStream);
}

/* released when the free is enqueued: the memory returns to the pool, reusable by this process */
static CUresult free_async(__typeof__(&cuMemFreeAsync) real, CUdeviceptr dptr, CUstream s)
{
    struct vgpu_tracked t = vgpu_untrack(dptr, VGPU_K_DPTR);
    CUresult rc = real(dptr, s);

    vgpu_untrack_done(rc, dptr, VGPU_K_DPTR, t);
    return rc;
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(REAL(cuMemFreeAsync), dptr, hStream);
}
VGPU_OWN_ALIAS(cuMemFreeAsync)

VGPU_HIDDEN CUresult vgpu_own_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(vgpu_var_fn(VGPU_VAR_cuMemFreeAsync_ptsz), dptr, hStream);
}

/* ---- pools: remember each pool's device for drivers without CU_MEMPOOL_ATTR_LOCATION_* ---- */
VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult rc = REAL(cuMemPoolCreate)(pool, poolProps);

    if (rc == CUDA_SUCCESS && pool && poolProps)
        vgpu_table_put(KEY(*pool), VGPU_K_POOL, vgpu_dev_from_location(&poolProps->location), 0);
    return rc;
}
VGPU_OWN_ALIAS(cuMemPoolCreate)

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    int dev;
    uint64_t unused;
    CUresult rc = REAL(cuMemPoolDestroy)(pool);

    if (rc == CUDA_SUCCESS)
        vgpu_table_take(KEY(pool), VGPU_K_POOL, &dev, &unused);
    return rc;
}
VGPU_OWN_ALIAS(cuMemPoolDestroy)

VGPU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CUresult rc = REAL(cuDeviceGetDefaultMemPool)(pool_out, dev);

    if (rc == CUDA_SUCCESS && pool_out)
        vgpu_table_put(KEY(*pool_out), VGPU_K_POOL, vgpu_dev_check(dev), 0);
    return rc;
}
VGPU_OWN_ALIAS(cuDeviceGetDefaultMemPool)

VGPU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = REAL(cuDeviceGetMemPool)(pool, dev);

    if (rc == CUDA_SUCCESS && pool)
        vgpu_table_put(KEY(*pool), VGPU_K_POOL, vgpu_dev_check(dev), 0);
    return rc;
}
VGPU_OWN_ALIAS(cuDeviceGetMemPool)
