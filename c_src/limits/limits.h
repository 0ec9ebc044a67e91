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
/* The limit in force, one rule for memory and SM limits alike: the stricter of the region's value
 * and this process's env (0 = none on either side). A region can tighten a limit, never lift one,
 * because a region file may be written by another process of the container (or the vendor's). */
VGPU_HIDDEN uint64_t vgpu_limit_in_force(uint64_t region, uint64_t env);
/* an SM percent as stored or written (the vendor stores 100 for "none"): 1..99, or 0 = none */
VGPU_HIDDEN uint64_t vgpu_sm_norm(uint64_t percent);
/* 1 when some limit variable (CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i]) is set at all */
VGPU_HIDDEN int vgpu_limits_any_set(void);
/* 0 when some variable (memory or SM limit) was malformed: every allocation must then fail (never run unlimited) */
VGPU_HIDDEN int vgpu_limits_valid(void);
/* the one-line complaint for a malformed variable, "" when valid */
VGPU_HIDDEN const char *vgpu_limits_error(void);

#endif
