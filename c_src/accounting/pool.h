/* Stream-ordered memory pools are charged by what they really hold: the pool's reserved memory
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the sum of live allocations. A pool keeps freed
 * memory reserved up to its release threshold (PyTorch's cudaMallocAsync backend keeps all of
 * it), so an allocation-sized charge returned at cuMemFreeAsync would let a later cuMemAlloc
 * take the same bytes again.
 *
 * One allocation of a pool at a time may make the pool grow: vgpu_pool_begin holds the pool's
 * lock from reading its spare reserve, through the checked charge of the shortfall and the real
 * call, to vgpu_pool_end, which settles the charge to the reserve the driver reports. Threads that
 * saw the same spare reserve can therefore never all be let through (issue 20, item 1).
 *
 * A pool grows in steps, not by the shortfall (32 MiB on an H200 with driver 580: a 1-byte
 * allocation from an empty pool reserves 32 MiB). The step is learnt from the pool's growths, as a
 * bound it cannot be under (32 MiB until one is seen). A spare reserve that looks large enough may
 * still serve nothing (pieces too small, or frees pending on another stream), so an allocation is
 * charged the growth for all of it, rounded up to the step, and what the pool did not grow is given
 * back after the call: a growth that does not fit is refused before the pool grows, never grown
 * past the limit and undone. In a full container the pool's fully free steps are trimmed first, to
 * make room; the part of its spare in steps that are partly used cannot be counted on there.
 *
 * A pool destroyed while allocations are outstanding keeps their memory until they are freed
 * (the driver defers it): that part stays charged and is given back free by free. */
#ifndef VGPU_POOL_H
#define VGPU_POOL_H

#include <cuda.h>
#include <stdint.h>

#include "vgpu.h"

/* at most this many pools are charged by their reserve at once; allocations from further ones
 * are refused (one warning), never let through uncharged */
#define VGPU_POOLS_MAX 4096

struct vgpu_pool_op {
    int dev;
    int slot;      /* -1: charged per allocation (no reserve attribute), or nothing to charge */
    uint64_t need; /* charged before the call */
    uint64_t shortfall, reserved; /* what the spare reserve lacked, and the reserve, at the start */
    uint64_t spare;               /* the reserve's unused part (at the start, and after a trim of ours) */
    uint64_t ahead;               /* the spare at the start: in flight until the call returned */
    CUmemoryPool pool;
};

/* the device's current pool (what cuMemAllocAsync draws from), NULL when the driver cannot say */
VGPU_HIDDEN CUmemoryPool vgpu_pool_current(int dev);
/* before an allocation of `bytes` from pool on dev: CUDA_SUCCESS to make the call (then
 * vgpu_pool_end must follow), else the code to return without calling the driver */
VGPU_HIDDEN CUresult vgpu_pool_begin(struct vgpu_pool_op *op, int dev, CUmemoryPool pool, uint64_t bytes);
/* after the call that returned rc: settle the charge; the result is what the wrapper returns (an
 * allocation that grew the pool past the limit is undone and refused) */
VGPU_HIDDEN CUresult vgpu_pool_end(struct vgpu_pool_op *op, CUresult rc, CUdeviceptr *dptr, uint64_t bytes,
                                   CUstream s);
/* around any free of a device pointer: the pool allocation it was, if any (the table entry is
 * taken out before the free and put back if the driver refuses it) */
struct vgpu_pooled {
    int slot; /* -1: not a pool allocation we made */
    uint64_t size;
};
VGPU_HIDDEN struct vgpu_pooled vgpu_pool_untrack(CUdeviceptr p);
VGPU_HIDDEN void vgpu_pool_untrack_done(CUresult rc, CUdeviceptr p, struct vgpu_pooled t);
/* settle every pool of dev that no allocation is growing (before refusing: a synchronize may
 * have trimmed them); what was given back, and what the others are charged beyond their reserve */
VGPU_HIDDEN uint64_t vgpu_pool_settle_dev(int dev);
/* the pool is destroyed: its spare reserve is given back, what is still allocated stays charged */
VGPU_HIDDEN void vgpu_pool_forget(CUmemoryPool pool);
VGPU_HIDDEN void vgpu_pool_atfork_child(void);

#endif
