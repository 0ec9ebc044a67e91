/* Which device an allocation belongs to, from the call's own arguments first, then the current
 * context with its result checked. Results are bounds-checked device indices, or
 * VGPU_DEV_HOST (host memory: not charged) / VGPU_DEV_UNKNOWN (cannot tell: not charged). */
#ifndef VGPU_DEVICE_H
#define VGPU_DEVICE_H

#include <cuda.h>
#include <stddef.h>

#include "vgpu.h"

VGPU_HIDDEN int vgpu_dev_check(long long dev);
VGPU_HIDDEN int vgpu_dev_current(void);
VGPU_HIDDEN int vgpu_dev_single(void);
VGPU_HIDDEN int vgpu_dev_of_current_ctx(void);
VGPU_HIDDEN int vgpu_dev_from_location(const CUmemLocation *loc);
VGPU_HIDDEN int vgpu_dev_from_stream(CUstream stream);
VGPU_HIDDEN int vgpu_dev_from_pool(CUmemoryPool pool, CUstream stream);
VGPU_HIDDEN void vgpu_dev_forget_count(void);
/* the device's UUID as NVML prints it ("GPU-..."); 0 on success */
VGPU_HIDDEN int vgpu_dev_uuid(int ordinal, char *out, size_t n);

#endif
