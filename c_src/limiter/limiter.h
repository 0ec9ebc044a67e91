/* Launch hook for the SM limiter (implemented by the region layer; limiter_stub.c is the
 * default). Wrappers call it only when enabled:
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_before_launch(stream); */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include <cuda.h>

#include "vgpu.h"

VGPU_HIDDEN extern int vgpu_limiter_enabled;
VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream s);

#endif
