/* The budget on HAMi's shared region: one limit per device for every process of the container.
 *
 * reserve: our slot grows first, then the sum of used[dev] over live slots must fit the region's
 *          limit, else the claim is withdrawn (region/slots.c says why that order never exceeds
 *          it). No lock unless that fails: then under the region lock (flock; never held across a
 *          driver call) dead peers are reaped and the claim is tried once more. No limit: an
 *          atomic add, no lock.
 * release: an atomic subtract on our own slot, no lock.
 * used:    the container-wide sum, as HAMi's monitor computes it.
 * The region is attached on first use. When it cannot be (unwritable file, foreign format, all
 * slots live) a warning says why and the limits hold per process, with local counters. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>

#include "accounting/budget.h"
#include "interpose/real.h"
#include "limits/limits.h"
#include "region/region.h"

static uint64_t local_used[VGPU_MAX_DEVICES]; /* fallback when the region is unusable */
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
    for (i = 0; i < n; i++) {
        CUdevice dev;
        CUuuid u;
        const unsigned char *b = (const unsigned char *)u.bytes;

        if (REAL(cuDeviceGet)(&dev, i) != CUDA_SUCCESS || REAL(cuDeviceGetUuid_v2)(&u, dev) != CUDA_SUCCESS)
            continue; /* left empty: the monitor matches devices by index too */
        snprintf(cfg->uuid[i], sizeof cfg->uuid[i],
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    }
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
    /* issue-11: the stricter of region and env (a foreign region's 0 never lifts an env limit) */
    return r ? vgpu_region_limit(dev) : vgpu_limits_env(dev);
}

static int local_reserve(int dev, uint64_t bytes)
{
    uint64_t limit = vgpu_limits_env(dev), cur;

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

VGPU_HIDDEN int vgpu_budget_reserve(int dev, uint64_t bytes)
{
    int rc = -2;

    if (!in_range(dev))
        return 0;
    if (region()) {
        if (VGPU_UNLIKELY(!__atomic_load_n(&devices_known, __ATOMIC_RELAXED)))
            learn_devices();
        rc = vgpu_region_reserve(dev, bytes);
    }
    return rc == -2 ? local_reserve(dev, bytes) : rc;
}

VGPU_HIDDEN void vgpu_budget_release(int dev, uint64_t bytes)
{
    if (!in_range(dev))
        return;
    if (region() && vgpu_region_self())
        vgpu_region_release(dev, bytes);
    else
        __atomic_fetch_sub(&local_used[dev], bytes, __ATOMIC_RELAXED);
}

VGPU_HIDDEN uint64_t vgpu_budget_used(int dev)
{
    vgpu_region_t *r;

    if (!in_range(dev))
        return 0;
    r = region();
    return r ? vgpu_region_sum_used(r, dev) : __atomic_load_n(&local_used[dev], __ATOMIC_RELAXED);
}
