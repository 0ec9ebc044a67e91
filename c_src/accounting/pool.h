/* Stream-ordered memory pools are charged by what they really hold: the pool's reserved memory
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the sum of live allocations. A pool keeps freed
 * memory reserved up to its release threshold (PyTorch's cudaMallocAsync backend keeps all of
 * it), so an allocation-sized charge returned at cuMemFreeAsync would let a later cuMemAlloc
 * take the same bytes again. */
#ifndef VGPU_POOL_H
#define VGPU_POOL_H

#include <cuda.h>
#include <stdint.h>

#include "vgpu.h"

/* the device's current pool (what cuMemAllocAsync draws from), NULL when the driver cannot say */
VGPU_HIDDEN CUmemoryPool vgpu_pool_current(int dev);
/* bytes an allocation of `bytes` from pool may add to its reserve (what is not spare already) */
VGPU_HIDDEN uint64_t vgpu_pool_need(CUmemoryPool pool, uint64_t bytes);
/* read the pool's reserve and settle its charge on dev to it; 0, or -1 when the pool cannot be
 * charged this way (no attribute, table full): the caller then charges per allocation */
VGPU_HIDDEN int vgpu_pool_settle(CUmemoryPool pool, int dev);
/* settle every pool of dev (before refusing: a synchronize may have trimmed them) */
VGPU_HIDDEN void vgpu_pool_settle_dev(int dev);
/* the pool is gone: give its charge back */
VGPU_HIDDEN void vgpu_pool_forget(CUmemoryPool pool);
VGPU_HIDDEN void vgpu_pool_atfork_child(void);

#endif
