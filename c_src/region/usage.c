/* Accounting on this process's own slot of the attached region: reserve and release against a
 * limit the caller passes in (accounting/budget.c reads the limit in force once, limiter/limiter.c
 * the SM percent: limits/ decides, region/ only stores the region's words), the compute ledger,
 * and the exit holds dropped before a report. Above shm.c (which slot is ours, the mapping) and slots.c (sums, reaping, the shadow). */
#include <stdint.h>

#include "log/log.h"
#include "region/region.h"

VGPU_HIDDEN vgpu_ledger_t *vgpu_region_ledger(int dev)
{
    vgpu_region_t *r = vgpu_region_get();

    if (!r || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    return (vgpu_ledger_t *)(void *)&r->procs[VGPU_LEDGER_SLOT].used[dev];
}

/* Reports (cuMemGetInfo, NVML) count exit holds too: drop those of processes now gone first, so
 * a report never shows a finished process's memory. Only free slots with a hold cost a syscall. */
VGPU_HIDDEN void vgpu_region_tidy(void)
{
    vgpu_region_t *r = vgpu_region_get();

    if (r)
        vgpu_region_tidy_in(r);
}

/* ---- limits ---- */

VGPU_HIDDEN uint64_t vgpu_region_stored_limit(int dev)
{
    vgpu_region_t *r = vgpu_region_get();

    return r && dev >= 0 && dev < VGPU_MAX_DEVICES ? __atomic_load_n(&r->limit[dev], __ATOMIC_RELAXED) : 0;
}

VGPU_HIDDEN uint64_t vgpu_region_stored_sm_limit(int dev)
{
    vgpu_region_t *r = vgpu_region_get();

    return r && dev >= 0 && dev < VGPU_MAX_DEVICES ? __atomic_load_n(&r->sm_limit[dev], __ATOMIC_RELAXED) : 0;
}

/* Publish the claim as pending (a seq_cst add to our slot's used[dev].unused[2], a word the monitor
 * never reads), full fence, then sum every live slot's usage and pending claims, ours included; if it
 * fits, count it in our usage, then drop the pending word (in between it counts twice: safe). A scan
 * counts every claim published before it reaches that claim's slot, as pending or, once moved, in the
 * total (sum_slots reads them in the order that makes this hold); so a scan can miss only a claim
 * published after its own (store->fence->load on both sides), and the last claim published among any
 * racing ones has seen all the others: claims that do not fit together are never all kept. A race can
 * refuse a request that would have fitted (both see each other, both withdraw); it can never exceed the
 * limit, and the monitor's sum (usage only) never sees a claim that is withdrawn. */
static uint64_t *pending(vgpu_proc_slot_t *s, int dev)
{
    return &s->used[dev].unused[2];
}

static int claim(vgpu_proc_slot_t *self, vgpu_region_t *r, int dev, int kind, uint64_t bytes, uint64_t limit)
{
    int fits;

    __atomic_fetch_add(pending(self, dev), bytes, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    fits = vgpu_region_sum_claimed(r, dev) <= limit;
    if (fits)
        vgpu_slot_add_kind(self, dev, kind, bytes, __ATOMIC_SEQ_CST);
    vgpu_region_sub_sat(pending(self, dev), bytes);
    return fits;
}

static int self_only; /* the shared table turned to garbage after attach: judge our own usage only */

static int corrupt(vgpu_region_t *r, int dev, uint64_t sum)
{
    uint64_t mine = vgpu_region_self_used(dev);

    if (sum <= VGPU_SANE_BYTES || sum - mine <= VGPU_SANE_BYTES)
        return 0;
    (void)r;
    if (!__atomic_exchange_n(&self_only, 1, __ATOMIC_RELAXED))
        VGPU_WARN("region usage of device %d sums to %llu bytes: the process table is corrupt; memory limits "
                  "are per process only from now on", dev, (unsigned long long)sum);
    return 1;
}

/* Fast path, no lock: look, claim and check. Only when that fails, under the lock: look again,
 * reaping dead peers when there is no room, then claim and check (the same order: the lock
 * serialises slow paths and reaping, not fast paths, and the limit does not depend on it, so a
 * lock timeout is safe too). */
VGPU_HIDDEN int vgpu_region_reserve_kind(int dev, uint64_t bytes, int kind, uint64_t limit)
{
    vgpu_proc_slot_t *self = vgpu_region_self();
    vgpu_region_t *r = vgpu_region_get();
    uint64_t sum;
    int ok;

    if (r && !self && vgpu_region_left()) /* exiting: no slot counts it, none may be had under a limit */
        return limit ? -1 : 0;
    if (!self || !r)
        return -2;
    if (!limit) { /* no limit: nothing to check against, no lock */
        vgpu_shadow_add(dev, kind, bytes);
        vgpu_slot_add_kind(self, dev, kind, bytes, __ATOMIC_RELAXED);
        return 0;
    }
    if (bytes > limit)
        return -1;
    if (VGPU_UNLIKELY(__atomic_load_n(&self_only, __ATOMIC_RELAXED))) {
        if (vgpu_region_self_used(dev) > limit - bytes)
            return -1;
        vgpu_shadow_add(dev, kind, bytes);
        vgpu_slot_add_kind(self, dev, kind, bytes, __ATOMIC_RELAXED);
        return 0;
    }
    vgpu_shadow_add(dev, kind, bytes);
    if (VGPU_LIKELY(vgpu_region_sum_claimed(r, dev) <= limit - bytes) &&
        VGPU_LIKELY(claim(self, r, dev, kind, bytes, limit)))
        return 0;
    vgpu_region_lock();
    sum = vgpu_region_sum_claimed(r, dev);
    if (sum > limit - bytes && vgpu_region_reap(r, 1)) /* dead peers' usage out, then decide */
        sum = vgpu_region_sum_claimed(r, dev);
    if (sum > limit - bytes && corrupt(r, dev, sum)) {
        ok = vgpu_region_self_used(dev) <= limit - bytes;
        if (ok)
            vgpu_slot_add_kind(self, dev, kind, bytes, __ATOMIC_RELAXED);
    } else {
        ok = sum <= limit - bytes && claim(self, r, dev, kind, bytes, limit);
    }
    if (!ok)
        vgpu_shadow_sub(dev, kind, bytes);
    vgpu_region_unlock();
    return ok ? 0 : -1;
}

VGPU_HIDDEN int vgpu_region_reserve(int dev, uint64_t bytes, uint64_t limit)
{
    return vgpu_region_reserve_kind(dev, bytes, VGPU_USE_DATA, limit);
}

VGPU_HIDDEN void vgpu_region_release_kind(int dev, uint64_t bytes, int kind)
{
    vgpu_proc_slot_t *self = vgpu_region_self();
    if (!self)
        return;
    vgpu_shadow_sub(dev, kind, bytes);
    vgpu_slot_sub_kind(self, dev, kind, bytes);
}

VGPU_HIDDEN void vgpu_region_release(int dev, uint64_t bytes)
{
    vgpu_region_release_kind(dev, bytes, VGPU_USE_DATA);
}
