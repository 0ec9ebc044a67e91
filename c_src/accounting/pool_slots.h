/* Internal to accounting/: the pools' slots (pool.c, the measuring floor) as the charging floor
 * (pool_charge.c: an allocation's begin and end) uses them. Locks: pool.c's header. */
#ifndef VGPU_POOL_SLOTS_H
#define VGPU_POOL_SLOTS_H

#include <cuda.h>
#include <pthread.h>
#include <stdint.h>

#include "vgpu.h"

struct vgpu_pool_slot {
    pthread_mutex_t grow;
    CUmemoryPool pool; /* NULL: free */
    int dev;
    int dead;          /* destroyed with allocations outstanding: only frees remain */
    uint64_t charged;  /* what dev is charged for this pool (under grow) */
    uint64_t out;      /* bytes of its allocations made through us and not freed (under grow) */
    uint64_t step_low; /* the pool grows in steps of at least this (0: none seen yet; under grow) */
    uint64_t step_cap; /* ... and, as far as its growths show, of at most this (0: none seen) */
};

VGPU_HIDDEN struct vgpu_pool_slot *vgpu_pool_at(int i);
/* the pool's attribute a; -1 when the driver cannot say */
VGPU_HIDDEN int vgpu_pool_attr(CUmemoryPool pool, CUmemPool_attribute a, uint64_t *out);
/* the slot of a live pool, assigned on first use; -1 when none is left (one warning) */
VGPU_HIDDEN int vgpu_pool_slot_of(CUmemoryPool pool, int dev);
/* grow held: the step to charge by, and what the pool grows by for `bytes` (rounded up to it) */
VGPU_HIDDEN uint64_t vgpu_pool_step_for(const struct vgpu_pool_slot *s);
VGPU_HIDDEN uint64_t vgpu_pool_growth_for(const struct vgpu_pool_slot *s, uint64_t bytes);
/* grow held: learn the step from a growth of `grew` for a shortfall */
VGPU_HIDDEN void vgpu_pool_learn_step(struct vgpu_pool_slot *s, uint64_t grew, uint64_t shortfall);
/* grow held: charge dev exactly the reserve the driver reports; what was given back */
VGPU_HIDDEN uint64_t vgpu_pool_settle_to(struct vgpu_pool_slot *s, uint64_t reserved);
/* grow held: an allocation of the pool made through us, recorded for its free */
VGPU_HIDDEN void vgpu_pool_record(struct vgpu_pool_slot *s, int slot, CUdeviceptr p, uint64_t bytes);

#endif
