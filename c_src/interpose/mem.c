/* Wrappers of the linear allocators: cuMemAlloc, pitch, managed, stream-ordered and pools.
 * Each one: resolve real -> pick the device from the arguments -> charge -> call -> settle
 * (accounting/charge.h); stream-ordered ones charge their pool's reserve instead. */
#include <stdint.h>

#include <cuda.h>

#include "accounting/charge.h"
#include "accounting/device.h"
#include "accounting/pool.h"
#include "accounting/table.h"
#include "driver/real.h"

#define KEY(p) ((uint64_t)(uintptr_t)(p))

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);

    return VGPU_CHARGED_CURRENT(bytesize, VGPU_K_DPTR, real(dptr, bytesize), *dptr);
}
VGPU_OWN_ALIAS(cuMemAlloc_v2)

/* any free: a pool allocation (accounting/pool.h) or one charged by itself */
#define FREED(dptr, call) \
    __extension__({ \
        struct vgpu_pooled pooled_ = vgpu_pool_untrack(dptr); \
        CUresult frc_ = VGPU_UNTRACKED((dptr), VGPU_K_DPTR, (call)); \
        vgpu_pool_untrack_done(frc_, (dptr), pooled_); \
        frc_; \
    })

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return FREED(dptr, REAL(cuMemFree_v2)(dptr));
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
    CUresult rc = vgpu_charge_current(&dev, est);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    actual = rc == CUDA_SUCCESS && pPitch ? vgpu_mul_sat(*pPitch, Height) : est;
    return vgpu_settle_pitch(rc, dptr, dev, est, actual);
}
VGPU_OWN_ALIAS(cuMemAllocPitch_v2)

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    __typeof__(&cuMemAllocManaged) real = REAL(cuMemAllocManaged);

    return VGPU_CHARGED_CURRENT(bytesize, VGPU_K_MANAGED, real(dptr, bytesize, flags), *dptr);
}
VGPU_OWN_ALIAS(cuMemAllocManaged)

/* ---- stream-ordered: the device comes from the stream / pool, never from this thread's context.
 * The charge is the pool's reserve (accounting/pool.h): before the call, what the allocation may
 * add to it, with the pool held so that no other allocation sees the same spare reserve; after,
 * the reserve as the driver reports it. A pool that cannot be read that way (no reserve
 * attribute) is charged per allocation, as linear memory is. ---- */
#define POOLED(dev, pool, dptr, bytesize, stream, call) \
    __extension__({ \
        struct vgpu_pool_op op_; \
        CUresult rc_ = vgpu_pool_begin(&op_, (dev), (pool), (bytesize)); \
        if (rc_ == CUDA_SUCCESS) \
            rc_ = vgpu_pool_end(&op_, (call), (dptr), (bytesize), (stream)); \
        rc_; \
    })

static CUresult alloc_async(__typeof__(&cuMemAllocAsync) real, CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    int dev = vgpu_dev_from_stream(s);
    CUmemoryPool pool = vgpu_pool_current(dev);

    return POOLED(dev, pool, dptr, bytesize, s, real(dptr, bytesize, s));
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

    return POOLED(dev, pool, dptr, bytesize, s, real(dptr, bytesize, pool, s));
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

/* The memory goes back to its pool, which keeps it reserved (and charged) until the driver trims
 * the pool; only allocations charged one by one, or from a destroyed pool, are released here. */
VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return FREED(dptr, REAL(cuMemFreeAsync)(dptr, hStream));
}
VGPU_OWN_ALIAS(cuMemFreeAsync)

VGPU_HIDDEN CUresult vgpu_own_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return FREED(dptr, ((__typeof__(&cuMemFreeAsync))vgpu_var_fn(VGPU_VAR_cuMemFreeAsync_ptsz))(dptr, hStream));
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

    if (rc == CUDA_SUCCESS) {
        vgpu_table_take(KEY(pool), VGPU_K_POOL, &dev, &unused);
        vgpu_pool_forget(pool);
    }
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
