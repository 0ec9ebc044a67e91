/* Per-device memory and SM limits from the environment, read once by the constructor (env only). */
#ifndef VGPU_LIMITS_H
#define VGPU_LIMITS_H

#include <stdint.h>

#include "vgpu.h"

VGPU_HIDDEN void vgpu_limits_load_env(void);
/* bytes, 0 = no limit; dev outside [0, VGPU_MAX_DEVICES) = no limit */
VGPU_HIDDEN uint64_t vgpu_limits_env(int dev);
/* percent 1..99 from CUDA_DEVICE_SM_LIMIT[_<dev>], 0 = no SM limit (unset, 0 or >= 100) */
VGPU_HIDDEN uint64_t vgpu_limits_env_sm(int dev);
/* 0 when some variable (memory or SM limit) was malformed: every allocation must then fail (never run unlimited) */
VGPU_HIDDEN int vgpu_limits_valid(void);
/* the one-line complaint for a malformed variable, "" when valid */
VGPU_HIDDEN const char *vgpu_limits_error(void);

#endif
