/* The shared bodies of every allocating and freeing wrapper:
 *   VGPU_CHARGED(dev, bytes, kind, call, key): charge -> call -> settle (record key on success,
 *     give the charge back on failure); the driver is not called when the charge is refused.
 *   VGPU_CHARGED_CURRENT(bytes, kind, call, key): the same in this thread's current context.
 *   VGPU_UNTRACKED(key, kind, call): take the entry out of the table -> call -> give its charge
 *     back, or put it back if the driver refused the free.
 * Both evaluate to the CUresult the wrapper returns. */
#ifndef VGPU_CHARGE_H
#define VGPU_CHARGE_H

#include <cuda.h>
#include <stdint.h>

#include "vgpu.h"

/* CUDA_SUCCESS to go on, else the code the wrapper returns without calling the driver:
 * CUDA_ERROR_INVALID_VALUE while a limit variable is malformed, CUDA_ERROR_OUT_OF_MEMORY over the
 * limit (after measuring again what the driver holds, and one log line, rate-limited) */
VGPU_HIDDEN CUresult vgpu_charge(int dev, uint64_t bytes);
/* the same without the refusal's log line (the caller says what was refused) */
VGPU_HIDDEN CUresult vgpu_charge_quiet(int dev, uint64_t bytes);
/* the refusal's log line (rate-limited) for `what` ("an allocation of") `bytes` a caller of
 * vgpu_charge_quiet refuses */
VGPU_HIDDEN void vgpu_charge_refused(int dev, uint64_t bytes, const char *what);
/* the one policy for allocations made in this thread's current context: picks *dev and charges */
VGPU_HIDDEN CUresult vgpu_charge_current(int *dev, uint64_t bytes);
/* after the real call: rc == CUDA_SUCCESS records key -> (dev, bytes); otherwise the charge is returned.
 * Either way the charge has landed (vgpu_budget_landed). Every successful vgpu_charge* is followed by
 * this, or by its own vgpu_budget_landed of what it charged once its call has returned */
VGPU_HIDDEN void vgpu_settle(CUresult rc, uint64_t key, int kind, int dev, uint64_t bytes);
/* a pitched allocation charged est = width * height, settled to actual = pitch * height (0 when the
 * call failed); returns what the wrapper returns (padding that does not fit: freed, OUT_OF_MEMORY) */
VGPU_HIDDEN CUresult vgpu_settle_pitch(CUresult rc, CUdeviceptr *dptr, int dev, uint64_t est, uint64_t actual);
/* take key out of the table before the real free (so a concurrent allocation reusing the address
 * cannot be confused with it); vgpu_untrack_done puts it back if the free failed */
struct vgpu_tracked {
    int found;
    int dev;
    int kind; /* what it was found as: a VGPU_K_DPTR free may be a VGPU_K_MANAGED allocation */
    uint64_t size;
};
VGPU_HIDDEN struct vgpu_tracked vgpu_untrack(uint64_t key, int kind);
VGPU_HIDDEN void vgpu_untrack_done(CUresult rc, uint64_t key, int kind, struct vgpu_tracked t);
/* a * b saturating at UINT64_MAX (sizes computed from user descriptors) */
VGPU_HIDDEN uint64_t vgpu_mul_sat(uint64_t a, uint64_t b);

#define VGPU_CHARGED(dev, bytes, kind, call, key) \
    __extension__({ \
        CUresult rc_ = vgpu_charge((dev), (bytes)); \
        if (rc_ == CUDA_SUCCESS) { \
            rc_ = (call); \
            vgpu_settle(rc_, rc_ == CUDA_SUCCESS ? (uint64_t)(key) : 0, (kind), (dev), (bytes)); \
        } \
        rc_; \
    })

/* the same for an allocation in this thread's current context (vgpu_charge_current picks the device) */
#define VGPU_CHARGED_CURRENT(bytes, kind, call, key) \
    __extension__({ \
        int dev_; \
        CUresult rc_ = vgpu_charge_current(&dev_, (bytes)); \
        if (rc_ == CUDA_SUCCESS) { \
            rc_ = (call); \
            vgpu_settle(rc_, rc_ == CUDA_SUCCESS ? (uint64_t)(key) : 0, (kind), dev_, (bytes)); \
        } \
        rc_; \
    })

#define VGPU_UNTRACKED(key, kind, call) \
    __extension__({ \
        struct vgpu_tracked t_ = vgpu_untrack((uint64_t)(key), (kind)); \
        CUresult rc_ = (call); \
        vgpu_untrack_done(rc_, (uint64_t)(key), (kind), t_); \
        rc_; \
    })

#endif
