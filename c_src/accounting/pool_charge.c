/* The charging floor of pool allocations (see pool.h): one allocation of a pool at a time reads the
 * spare reserve, charges the growth it may cause (vgpu_charge) and, after the call, settles the
 * charge to the reserve the driver reports. Calls down into pool.c's slots and charge.c, never the
 * reverse. */
#include <pthread.h>
#include <stdint.h>

#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/pool.h"
#include "accounting/pool_slots.h"
#include "accounting/table.h"
#include "driver/real.h"

/* the pool's reserve and what of `bytes` its spare lacks (a `used` read before a trim may exceed
 * the reserve after it: the spare is then none) */
static void note_spare(struct vgpu_pool_op *op, uint64_t reserved, uint64_t used, uint64_t bytes)
{
    op->reserved = reserved;
    op->spare = reserved > used ? reserved - used : 0;
    op->shortfall = op->spare >= bytes ? 0 : bytes - op->spare;
}

/* grow held, the insurance refused: steps of the pool's spare that nothing uses are given back to
 * make room (the pool would keep them up to its release threshold; being refused is worse). 1
 * when the reserve went down. */
static int trim_spare(struct vgpu_pool_slot *s, struct vgpu_pool_op *op, CUmemoryPool pool, uint64_t used,
                      uint64_t bytes)
{
    uint64_t reserved;

    if (REAL(cuMemPoolTrimTo)(pool, used) != CUDA_SUCCESS ||
        vgpu_pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 || reserved >= op->reserved)
        return 0;
    vgpu_pool_settle_to(s, reserved);
    note_spare(op, reserved, used, bytes);
    return 1;
}

VGPU_HIDDEN CUresult vgpu_pool_begin(struct vgpu_pool_op *op, int dev, CUmemoryPool pool, uint64_t bytes)
{
    uint64_t reserved, used;
    struct vgpu_pool_slot *s;
    CUresult rc;

    op->dev = dev;
    op->slot = -1;
    op->need = op->spare = op->ahead = 0;
    op->pool = pool;
    if (dev < 0)
        return CUDA_SUCCESS; /* host pool or unknown device: not charged */
    if (!pool) {
        op->need = bytes;
        return vgpu_charge(dev, bytes);
    }
    if ((op->slot = vgpu_pool_slot_of(pool, dev)) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s = vgpu_pool_at(op->slot);
    pthread_mutex_lock(&s->grow);
    if (s->pool != pool || s->dead || vgpu_pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
        vgpu_pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0 || used > reserved) {
        /* no reserve to read (or destroyed meanwhile): charged per allocation, like linear memory */
        pthread_mutex_unlock(&s->grow);
        op->slot = -1;
        op->need = bytes;
        return vgpu_charge(dev, bytes);
    }
    vgpu_pool_settle_to(s, reserved); /* trimmed since the last allocation: the charge follows */
    note_spare(op, reserved, used, bytes);
    /* the spare is charged, and until the call returns maybe trimmed by a synchronize in another
     * thread (a reading settles only the pools no allocation is growing): in flight */
    op->ahead = op->spare;
    vgpu_budget_ahead(dev, op->ahead);
    /* Insured as if none of the spare could serve it: a spare in pieces smaller than the
     * allocation, or freed on another stream and not yet reusable, lets the driver grow the pool
     * where the spare looked enough. Grown past the limit and undone, that was over the limit for
     * a moment, thousands of times a second in a full container on an H200. What the pool does not
     * grow is given back in vgpu_pool_end. */
    op->need = vgpu_pool_growth_for(s, bytes);
    rc = vgpu_charge_quiet(dev, op->need);
    if (rc != CUDA_SUCCESS && op->spare >= vgpu_pool_step_for(s) && trim_spare(s, op, pool, used, bytes))
        rc = vgpu_charge_quiet(dev, op->need); /* the pool's free steps made room */
    if (rc != CUDA_SUCCESS) {
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            vgpu_charge_refused(dev, bytes, "an allocation of");
        vgpu_budget_landed(dev, op->ahead);
        pthread_mutex_unlock(&s->grow);
        return rc;
    }
    return rc;
}

/* grow held: the allocation grew the pool beyond its shortfall (granularity, or a trim from
 * another thread between reading and calling) and the excess does not fit: free it, trim the pool
 * back to what is charged and refuse */
static CUresult undo(struct vgpu_pool_slot *s, CUmemoryPool pool, CUdeviceptr *dptr, CUstream st)
{
    uint64_t reserved;

    REAL(cuMemFreeAsync)(*dptr, st);
    REAL(cuStreamSynchronize)(st);
    REAL(cuMemPoolTrimTo)(pool, s->charged);
    *dptr = 0;
    if (vgpu_pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0)
        vgpu_pool_settle_to(s, reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_HIDDEN CUresult vgpu_pool_end(struct vgpu_pool_op *op, CUresult rc, CUdeviceptr *dptr, uint64_t bytes,
                                   CUstream st)
{
    struct vgpu_pool_slot *s;
    uint64_t reserved;

    if (op->dev < 0)
        return rc;
    if (op->slot < 0) {
        vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, op->dev, op->need);
        return rc;
    }
    s = vgpu_pool_at(op->slot);
    s->charged += op->need; /* the shortfall is the pool's now */
    if (vgpu_pool_attr(op->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) {
        if (rc != CUDA_SUCCESS) { /* unreadable now: a failed call took nothing */
            vgpu_budget_release(s->dev, op->need);
            s->charged -= op->need;
        }
    } else {
        if (rc == CUDA_SUCCESS && reserved > op->reserved)
            vgpu_pool_learn_step(s, reserved - op->reserved, op->shortfall);
        if (rc != CUDA_SUCCESS || reserved <= s->charged)
            vgpu_pool_settle_to(s, reserved);
        else if (vgpu_budget_reserve(s->dev, reserved - s->charged, vgpu_budget_limit(s->dev)) == 0)
            s->charged = reserved; /* grew by more than the step we knew */
        else
            rc = undo(s, op->pool, dptr, st);
    }
    if (rc == CUDA_SUCCESS)
        vgpu_pool_record(s, op->slot, *dptr, bytes);
    vgpu_budget_landed(s->dev, op->need + op->ahead); /* the charge follows the reserve the driver reported */
    pthread_mutex_unlock(&s->grow);
    return rc;
}
