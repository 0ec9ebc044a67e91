/* Launch hooks for the SM limiter (limiter.c). Wrappers call them only when enabled, around the
 * real launch (the pair measures the launch's GPU time):
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_before_launch(stream);
 *   rc = real(...);
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_after_launch(stream); */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include <cuda.h>

#include "vgpu.h"

VGPU_HIDDEN extern int vgpu_limiter_enabled;
VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream s);
VGPU_HIDDEN void vgpu_limiter_after_launch(CUstream s);

#endif
