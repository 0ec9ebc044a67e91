/* Policy glue between the wrappers and budget/table; the only place that decides to charge. */
#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/table.h"
#include "limits/limits.h"
#include "log/log.h"

VGPU_HIDDEN CUresult vgpu_charge(int dev, uint64_t bytes)
{
    if (VGPU_UNLIKELY(!vgpu_limits_valid()))
        return CUDA_ERROR_INVALID_VALUE; /* never run unlimited on a malformed limit */
    if (dev < 0)
        return CUDA_SUCCESS; /* host or unknown location: not charged */
    return vgpu_budget_reserve(dev, bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_HIDDEN void vgpu_settle(CUresult rc, uint64_t key, int kind, int dev, uint64_t bytes)
{
    if (dev < 0)
        return;
    if (rc != CUDA_SUCCESS) {
        vgpu_budget_release(dev, bytes);
        return;
    }
    if (vgpu_table_put(key, kind, dev, bytes) != 0) {
        vgpu_budget_release(dev, bytes);
        VGPU_ERROR("out of memory tracking an allocation of %llu bytes on device %d; it is not counted",
                   (unsigned long long)bytes, dev);
    }
}

VGPU_HIDDEN struct vgpu_tracked vgpu_untrack(uint64_t key, int kind)
{
    struct vgpu_tracked t = {0, VGPU_DEV_UNKNOWN, 0};

    if (key)
        t.found = vgpu_table_take(key, kind, &t.dev, &t.size);
    return t;
}

VGPU_HIDDEN void vgpu_untrack_done(CUresult rc, uint64_t key, int kind, struct vgpu_tracked t)
{
    if (!t.found)
        return;
    if (rc == CUDA_SUCCESS)
        vgpu_budget_release(t.dev, t.size);
    else
        vgpu_table_put(key, kind, t.dev, t.size); /* the driver kept it: keep counting it */
}

VGPU_HIDDEN uint64_t vgpu_mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
