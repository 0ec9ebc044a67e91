/* The budget on HAMi's shared region: one limit per device for every process of the container.
 *
 * reserve: our slot grows first, then the sum of used[dev] over live slots must fit the region's
 *          limit, else the claim is withdrawn (region/slots.c says why that order never exceeds
 *          it). No lock unless that fails: then under the region lock (flock; never held across a
 *          driver call) dead peers are reaped and the claim is tried once more. No limit: an
 *          atomic add, no lock.
 * release: an atomic subtract on our own slot, no lock.
 * force:   memory the driver already took (contexts, pool reserves): counted whatever the limit.
 * used:    the container-wide sum, as HAMi's monitor computes it, plus what exiting processes still
 *          hold (region/slots.c, exit holds); mine: this process's part.
 * The region is attached on first use. When it cannot be (unwritable file, foreign format, all
 * slots live) a warning says why and the limits hold per process, with local counters. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "accounting/budget.h"
#include "accounting/device.h"
#include "driver/real.h"
#include "limits/limits.h"
#include "region/region.h"

static uint64_t local_used[VGPU_MAX_DEVICES]; /* fallback when the region is unusable */
static uint64_t mine[VGPU_MAX_DEVICES];       /* this process's charges, region or not */
static uint64_t in_flight[VGPU_MAX_DEVICES];  /* the part of them ahead of driver calls not yet returned */
static __thread uint64_t own_ahead[VGPU_MAX_DEVICES]; /* this thread's part of in_flight */
static uint64_t unshown[VGPU_MAX_DEVICES];    /* managed charges: NVML shows them once touched */
static int paused[VGPU_MAX_DEVICES];          /* a reading waits for in_flight to drain: new charges wait */
static int state;                             /* 0 not tried, 1 region, -1 local */
static int devices_known;
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;

static int in_range(int dev)
{
    return dev >= 0 && dev < VGPU_MAX_DEVICES;
}

/* visible devices and their UUIDs, when the driver is initialised; 0 devices otherwise */
static void device_facts(vgpu_region_config_t *cfg)
{
    int n = 0, i;

    if (REAL(cuDeviceGetCount)(&n) != CUDA_SUCCESS || n <= 0)
        return;
    if (n > VGPU_MAX_DEVICES)
        n = VGPU_MAX_DEVICES;
    for (i = 0; i < n; i++)
        vgpu_dev_uuid(i, cfg->uuid[i], sizeof cfg->uuid[i]); /* left empty on failure: the monitor matches by index too */
    cfg->device_count = n;
}

static void attach(void)
{
    vgpu_region_config_t cfg;

    memset(&cfg, 0, sizeof cfg);
    vgpu_region_config_from_env(&cfg);
    device_facts(&cfg);
    devices_known = cfg.device_count > 0;
    __atomic_store_n(&state, vgpu_region_attach(NULL, &cfg) == 0 ? 1 : -1, __ATOMIC_RELEASE);
}

/* a region created before cuInit has no device list yet: add it once the driver can tell */
static void learn_devices(void)
{
    vgpu_region_config_t cfg;

    memset(&cfg, 0, sizeof cfg);
    device_facts(&cfg);
    if (cfg.device_count > 0) {
        vgpu_region_fill_devices(&cfg);
        __atomic_store_n(&devices_known, 1, __ATOMIC_RELAXED);
    }
}

static vgpu_region_t *region(void)
{
    if (VGPU_UNLIKELY(!__atomic_load_n(&state, __ATOMIC_ACQUIRE)))
        pthread_once(&attach_once, attach);
    return vgpu_region_get(); /* NULL when local, or in a fork child that could not get a slot */
}

VGPU_HIDDEN uint64_t vgpu_budget_limit(int dev)
{
    vgpu_region_t *r;

    if (!in_range(dev))
        return 0;
    r = region();
    /* limits/ decides (vgpu_limit_in_force): a foreign region's 0 never lifts an env limit */
    return vgpu_limit_in_force(r ? vgpu_region_stored_limit(dev) : 0, vgpu_limits_env(dev));
}

VGPU_HIDDEN uint64_t vgpu_budget_limit_peek(int dev)
{
    if (!in_range(dev))
        return 0;
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == 1 && vgpu_region_get())
        return vgpu_limit_in_force(vgpu_region_stored_limit(dev), vgpu_limits_env(dev));
    return vgpu_limits_env(dev);
}

static int local_reserve(int dev, uint64_t bytes, uint64_t limit)
{
    uint64_t cur;

    if (!limit) {
        __atomic_fetch_add(&local_used[dev], bytes, __ATOMIC_RELAXED);
        return 0;
    }
    cur = __atomic_load_n(&local_used[dev], __ATOMIC_RELAXED);
    do {
        if (bytes > limit || cur > limit - bytes)
            return -1;
    } while (!__atomic_compare_exchange_n(&local_used[dev], &cur, cur + bytes, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 0;
}

VGPU_HIDDEN int vgpu_budget_reserve(int dev, uint64_t bytes, uint64_t limit)
{
    int rc = -2;

    if (!in_range(dev))
        return 0;
    if (region()) {
        if (VGPU_UNLIKELY(!__atomic_load_n(&devices_known, __ATOMIC_RELAXED)))
            learn_devices();
        rc = vgpu_region_reserve(dev, bytes, limit);
    }
    if (rc == -2)
        rc = local_reserve(dev, bytes, limit);
    if (rc == 0)
        __atomic_fetch_add(&mine[dev], bytes, __ATOMIC_RELAXED);
    return rc;
}

VGPU_HIDDEN void vgpu_budget_force(int dev, uint64_t bytes)
{
    vgpu_proc_slot_t *self;

    if (!in_range(dev) || !bytes)
        return;
    self = region() ? vgpu_region_self() : NULL;
    if (self)
        vgpu_slot_add(self, dev, bytes);
    else
        __atomic_fetch_add(&local_used[dev], bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&mine[dev], bytes, __ATOMIC_RELAXED);
}

static void sub_saturating(uint64_t *p, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);

    while (!__atomic_compare_exchange_n(p, &cur, cur > bytes ? cur - bytes : 0, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

VGPU_HIDDEN void vgpu_budget_release(int dev, uint64_t bytes)
{
    if (!in_range(dev))
        return;
    if (region() && vgpu_region_self())
        vgpu_region_release(dev, bytes);
    else
        sub_saturating(&local_used[dev], bytes);
    sub_saturating(&mine[dev], bytes);
}

VGPU_HIDDEN uint64_t vgpu_budget_mine(int dev)
{
    return in_range(dev) ? __atomic_load_n(&mine[dev], __ATOMIC_RELAXED) : 0;
}

/* A reading pauses the charges ahead of driver calls for a moment (PAUSE_DRAIN_NS for the ones in
 * flight to land, PAUSE_WAIT_NS for new ones to wait) so that every charge it reads is surely held
 * or surely not: then NVML's figure less our charges is the overhead itself, not a range. Both
 * bounded: a driver call may be long (a free waiting for the device), and the reading is then only
 * a range, as without the pause. */
#define PAUSE_DRAIN_NS 2000000ull
#define PAUSE_WAIT_NS 5000000ull

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nap(void)
{
    struct timespec ts = {0, 20000};

    nanosleep(&ts, NULL);
}

VGPU_HIDDEN void vgpu_budget_ahead(int dev, uint64_t bytes)
{
    uint64_t end;

    if (!in_range(dev) || !bytes)
        return;
    own_ahead[dev] += bytes;
    /* added, then the pause looked at; the reading pauses, then looks at in_flight (both seq_cst):
     * one of the two sees the other. A thread with more in flight goes on: the reading waits for it. */
    __atomic_fetch_add(&in_flight[dev], bytes, __ATOMIC_SEQ_CST);
    if (own_ahead[dev] != bytes || !__atomic_load_n(&paused[dev], __ATOMIC_SEQ_CST))
        return;
    sub_saturating(&in_flight[dev], bytes);
    for (end = now_ns() + PAUSE_WAIT_NS; __atomic_load_n(&paused[dev], __ATOMIC_SEQ_CST) && now_ns() < end;)
        nap();
    __atomic_fetch_add(&in_flight[dev], bytes, __ATOMIC_SEQ_CST);
}

VGPU_HIDDEN void vgpu_budget_landed(int dev, uint64_t bytes)
{
    if (!in_range(dev))
        return;
    own_ahead[dev] -= bytes < own_ahead[dev] ? bytes : own_ahead[dev];
    sub_saturating(&in_flight[dev], bytes);
}

VGPU_HIDDEN uint64_t vgpu_budget_in_flight(int dev)
{
    return in_range(dev) ? __atomic_load_n(&in_flight[dev], __ATOMIC_SEQ_CST) : 0;
}

VGPU_HIDDEN void vgpu_budget_unshown(int dev, uint64_t bytes, int add)
{
    if (!in_range(dev))
        return;
    if (add)
        __atomic_fetch_add(&unshown[dev], bytes, __ATOMIC_SEQ_CST);
    else
        sub_saturating(&unshown[dev], bytes);
}

VGPU_HIDDEN uint64_t vgpu_budget_unshown_now(int dev)
{
    return in_range(dev) ? __atomic_load_n(&unshown[dev], __ATOMIC_SEQ_CST) : 0;
}

VGPU_HIDDEN int vgpu_budget_pause(int dev)
{
    uint64_t end;

    if (!in_range(dev))
        return 0;
    __atomic_store_n(&paused[dev], 1, __ATOMIC_SEQ_CST);
    for (end = now_ns() + PAUSE_DRAIN_NS; __atomic_load_n(&in_flight[dev], __ATOMIC_SEQ_CST) > own_ahead[dev];) {
        if (now_ns() >= end)
            return 0;
        nap();
    }
    return 1;
}

VGPU_HIDDEN void vgpu_budget_resume(int dev)
{
    if (in_range(dev))
        __atomic_store_n(&paused[dev], 0, __ATOMIC_SEQ_CST);
}

VGPU_HIDDEN void vgpu_budget_atfork_child(void)
{
    memset(mine, 0, sizeof mine);
    memset(in_flight, 0, sizeof in_flight);
    memset(own_ahead, 0, sizeof own_ahead); /* the forking thread's: the child's only thread */
    memset(unshown, 0, sizeof unshown);
    memset(paused, 0, sizeof paused);
    memset(local_used, 0, sizeof local_used);
}

VGPU_HIDDEN uint64_t vgpu_budget_sum(int dev)
{
    vgpu_region_t *r;

    if (!in_range(dev))
        return 0;
    r = region();
    return r ? vgpu_region_sum_used(r, dev) : __atomic_load_n(&local_used[dev], __ATOMIC_RELAXED);
}

VGPU_HIDDEN uint64_t vgpu_budget_ctx_hint(int dev, uint64_t device_bytes)
{
    return in_range(dev) && region() ? vgpu_region_ctx_hint(dev, device_bytes) : 0;
}

VGPU_HIDDEN void vgpu_budget_set_ctx_hint(int dev, uint64_t bytes)
{
    if (in_range(dev) && region())
        vgpu_region_set_ctx_hint(dev, bytes);
}

VGPU_HIDDEN uint64_t vgpu_budget_used(int dev)
{
    if (in_range(dev) && region())
        vgpu_region_tidy();
    return vgpu_budget_sum(dev);
}
