/* Policy glue between the wrappers and budget/table; the only place that decides to charge. */
#include <time.h>

#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/device.h"
#include "accounting/overhead.h"
#include "accounting/pool.h"
#include "accounting/table.h"
#include "driver/real.h"
#include "limits/limits.h"
#include "log/log.h"

#define MiB (1024.0 * 1024.0)

/* Within this distance of the limit, what the driver holds beyond our charges is measured again
 * before deciding (it grows as modules load); further away a stale figure cannot matter. */
static uint64_t near_margin(uint64_t limit)
{
    uint64_t m = limit / 16;

    return m < (32u << 20) ? (32u << 20) : m > (512u << 20) ? (512u << 20) : m;
}

/* 1 when `bytes` more would come within that margin of `limit` (or past it) */
static int near_limit(int dev, uint64_t bytes, uint64_t limit)
{
    uint64_t used;

    if (!limit)
        return 0;
    used = vgpu_budget_sum(dev);
    return used + bytes + near_margin(limit) > limit || used + bytes < used;
}

/* One line per refusal, at most one a second per process; the ones in between are counted. */
static void refused(int dev, uint64_t bytes, const char *what, uint64_t limit)
{
    static uint64_t last_s;
    static unsigned suppressed;
    struct timespec ts;
    uint64_t now, prev;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (uint64_t)ts.tv_sec;
    prev = __atomic_load_n(&last_s, __ATOMIC_RELAXED);
    if (prev && now - prev < 1) {
        __atomic_fetch_add(&suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    if (!__atomic_compare_exchange_n(&last_s, &prev, now ? now : 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    VGPU_WARN("device %d: refused %s %.1f MiB: the container uses %.1f of its %.1f MiB limit (this "
              "process %.1f MiB, host pid %u)%s",
              dev, what, bytes / MiB, vgpu_budget_used(dev) / MiB, limit / MiB,
              vgpu_budget_mine(dev) / MiB, vgpu_overhead_host_pid(),
              __atomic_exchange_n(&suppressed, 0, __ATOMIC_RELAXED) ? "; earlier refusals in the last second not shown"
                                                                   : "");
}

VGPU_HIDDEN void vgpu_charge_refused(int dev, uint64_t bytes, const char *what)
{
    refused(dev, bytes, what, vgpu_budget_limit(dev));
}

/* The limit in force is read once here and passed down to every floor below. */
static CUresult charge(int dev, uint64_t bytes, int log)
{
    uint64_t limit;
    int measured = 0;

    if (VGPU_UNLIKELY(!vgpu_limits_valid()))
        return CUDA_ERROR_INVALID_VALUE; /* never run unlimited on a malformed limit */
    if (dev < 0)
        return CUDA_SUCCESS; /* host or unknown location: not charged */
    limit = vgpu_budget_limit(dev);
    /* measured with nothing of ours in flight (a reading waits for what is: accounting/budget.c) */
    if (VGPU_UNLIKELY(near_limit(dev, bytes, limit)))
        measured = vgpu_overhead_refresh(dev, VGPU_REFRESH_CHARGE, limit);
    vgpu_budget_ahead(dev, bytes); /* until vgpu_budget_landed: charged, maybe not yet held by the driver */
    if (VGPU_LIKELY(vgpu_budget_reserve(dev, bytes, limit) == 0))
        return CUDA_SUCCESS;
    vgpu_budget_landed(dev, bytes);
    /* before refusing: pools may have been trimmed at a synchronize, contexts destroyed (measured
     * once per refusal: NVML may take 200 ms a call) */
    vgpu_pool_settle_dev(dev);
    if (!measured)
        vgpu_overhead_refresh(dev, VGPU_REFRESH_FORCE | VGPU_REFRESH_CHARGE, limit);
    vgpu_budget_ahead(dev, bytes);
    if (vgpu_budget_reserve(dev, bytes, limit) == 0)
        return CUDA_SUCCESS;
    vgpu_budget_landed(dev, bytes);
    if (log)
        refused(dev, bytes, "an allocation of", limit);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_HIDDEN CUresult vgpu_charge(int dev, uint64_t bytes)
{
    return charge(dev, bytes, 1);
}

VGPU_HIDDEN CUresult vgpu_charge_quiet(int dev, uint64_t bytes)
{
    return charge(dev, bytes, 0);
}

/* Charge an allocation made in this thread's current context. With a single visible device (the
 * driver's count, cached after cuInit) it can only land on device 0, so no cuCtxGetDevice on the
 * hot path (vgpu_dev_of_current_ctx). Without a current context the real call fails and
 * vgpu_settle gives the charge back; if the charge is refused, the real query decides, so a
 * context-less call still gets the driver's own error, never OUT_OF_MEMORY. */
VGPU_HIDDEN CUresult vgpu_charge_current(int *dev, uint64_t bytes)
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

/* managed allocations alive: while there are none a free looks for one kind only */
static unsigned long managed_live;

VGPU_HIDDEN void vgpu_settle(CUresult rc, uint64_t key, int kind, int dev, uint64_t bytes)
{
    if (dev < 0)
        return;
    if (rc != CUDA_SUCCESS) {
        vgpu_budget_release(dev, bytes);
    } else if (vgpu_table_put(key, kind, dev, bytes) != 0) {
        vgpu_budget_release(dev, bytes);
        VGPU_ERROR("out of memory tracking an allocation of %llu bytes on device %d; it is not counted",
                   (unsigned long long)bytes, dev);
    } else if (kind == VGPU_K_MANAGED) {
        __atomic_fetch_add(&managed_live, 1, __ATOMIC_RELAXED);
        vgpu_budget_unshown(dev, bytes, 1);
    }
    vgpu_budget_landed(dev, bytes);
}

/* A pitched allocation was charged its width * height (`est`): settle it to what the driver took,
 * pitch * height (`actual`). Padding that does not fit is freed again and refused. */
VGPU_HIDDEN CUresult vgpu_settle_pitch(CUresult rc, CUdeviceptr *dptr, int dev, uint64_t est, uint64_t actual)
{
    if (rc != CUDA_SUCCESS || dev < 0) {
        vgpu_settle(rc, 0, VGPU_K_DPTR, dev, est);
        return rc;
    }
    if (actual > est) {
        vgpu_budget_ahead(dev, actual - est); /* what lands is the real size */
        if (vgpu_budget_reserve(dev, actual - est, vgpu_budget_limit(dev)) != 0) {
            REAL(cuMemFree_v2)(*dptr); /* padding pushed it over the limit */
            vgpu_budget_release(dev, est);
            vgpu_budget_landed(dev, actual);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        vgpu_budget_release(dev, est - actual);
        vgpu_budget_landed(dev, est - actual);
    }
    vgpu_settle(CUDA_SUCCESS, *dptr, VGPU_K_DPTR, dev, actual);
    return CUDA_SUCCESS;
}

VGPU_HIDDEN struct vgpu_tracked vgpu_untrack(uint64_t key, int kind)
{
    struct vgpu_tracked t = {0, VGPU_DEV_UNKNOWN, kind, 0};

    if (!key)
        return t;
    t.found = vgpu_table_take(key, kind, &t.dev, &t.size);
    if (!t.found && kind == VGPU_K_DPTR && __atomic_load_n(&managed_live, __ATOMIC_RELAXED))
        t.found = vgpu_table_take(key, t.kind = VGPU_K_MANAGED, &t.dev, &t.size);
    if (t.found)
        vgpu_budget_ahead(t.dev, t.size); /* the driver may give it back before the call returns */
    return t;
}

VGPU_HIDDEN void vgpu_untrack_done(CUresult rc, uint64_t key, int kind, struct vgpu_tracked t)
{
    (void)kind; /* t.kind: what it was found as */
    if (!t.found)
        return;
    if (rc != CUDA_SUCCESS) {
        vgpu_table_put(key, t.kind, t.dev, t.size); /* the driver kept it: keep counting it */
    } else {
        vgpu_budget_release(t.dev, t.size);
        if (t.kind == VGPU_K_MANAGED) {
            vgpu_budget_unshown(t.dev, t.size, 0);
            __atomic_fetch_sub(&managed_live, 1, __ATOMIC_RELAXED);
        }
    }
    vgpu_budget_landed(t.dev, t.size);
}

VGPU_HIDDEN uint64_t vgpu_mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
