/* Process-local budget: one atomic counter per device, CAS so concurrent reserves never overshoot. */
#include "accounting/budget.h"
#include "limits/limits.h"

static uint64_t used[VGPU_MAX_DEVICES];

static int in_range(int dev)
{
    return dev >= 0 && dev < VGPU_MAX_DEVICES;
}

VGPU_HIDDEN uint64_t vgpu_budget_limit(int dev)
{
    return vgpu_limits_env(dev);
}

VGPU_HIDDEN int vgpu_budget_reserve(int dev, uint64_t bytes)
{
    uint64_t limit, cur;

    if (!in_range(dev))
        return 0;
    limit = vgpu_budget_limit(dev);
    if (!limit) {
        __atomic_fetch_add(&used[dev], bytes, __ATOMIC_RELAXED);
        return 0;
    }
    cur = __atomic_load_n(&used[dev], __ATOMIC_RELAXED);
    do {
        if (bytes > limit || cur > limit - bytes)
            return -1;
    } while (!__atomic_compare_exchange_n(&used[dev], &cur, cur + bytes, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return 0;
}

VGPU_HIDDEN void vgpu_budget_release(int dev, uint64_t bytes)
{
    if (in_range(dev))
        __atomic_fetch_sub(&used[dev], bytes, __ATOMIC_RELAXED);
}

VGPU_HIDDEN uint64_t vgpu_budget_used(int dev)
{
    return in_range(dev) ? __atomic_load_n(&used[dev], __ATOMIC_RELAXED) : 0;
}
