/* Launch hooks for the SM limiter and the monitor's signals (limiter.c). Wrappers call them
 * around the real launch (the pair measures a sampled launch's GPU time):
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_before_launch(stream, is_graph);
 *   rc = real(...);
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_after_launch(stream); */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include <cuda.h>

#include "vgpu.h"

VGPU_HIDDEN extern int vgpu_limiter_enabled;
VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream s, int graph);
VGPU_HIDDEN void vgpu_limiter_after_launch(CUstream s);
/* 1 when some SM limit may throttle this process (the env has one and the policy allows it) */
VGPU_HIDDEN int vgpu_limiter_throttles(void);

#endif
