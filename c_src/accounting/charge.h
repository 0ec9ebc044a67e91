/* The shared body of every allocating / freeing wrapper: reserve before the real call,
 * settle after it (record on success, give back on failure). */
#ifndef VGPU_CHARGE_H
#define VGPU_CHARGE_H

#include <cuda.h>
#include <stdint.h>

#include "vgpu.h"

/* CUDA_SUCCESS to go on, else the code the wrapper returns without calling the driver:
 * CUDA_ERROR_INVALID_VALUE while a limit variable is malformed, CUDA_ERROR_OUT_OF_MEMORY over the limit */
VGPU_HIDDEN CUresult vgpu_charge(int dev, uint64_t bytes);
/* after the real call: rc == CUDA_SUCCESS records key -> (dev, bytes); otherwise the charge is returned */
VGPU_HIDDEN void vgpu_settle(CUresult rc, uint64_t key, int kind, int dev, uint64_t bytes);
/* take key out of the table before the real free (so a concurrent allocation reusing the address
 * cannot be confused with it); vgpu_untrack_done puts it back if the free failed */
struct vgpu_tracked {
    int found;
    int dev;
    uint64_t size;
};
VGPU_HIDDEN struct vgpu_tracked vgpu_untrack(uint64_t key, int kind);
VGPU_HIDDEN void vgpu_untrack_done(CUresult rc, uint64_t key, int kind, struct vgpu_tracked t);
/* a * b saturating at UINT64_MAX (sizes computed from user descriptors) */
VGPU_HIDDEN uint64_t vgpu_mul_sat(uint64_t a, uint64_t b);

#endif
