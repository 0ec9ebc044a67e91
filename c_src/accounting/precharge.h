/* The charging floor's brackets around driver calls that take device memory outside any allocation:
 * context creations and streams. What they will take is charged first, and a call that would not
 * fit is refused before the driver takes its memory; what they took is then measured (overhead.c,
 * the floor below) and the stand-in dropped. */
#ifndef VGPU_PRECHARGE_H
#define VGPU_PRECHARGE_H

#include <cuda.h>

#include "accounting/overhead.h"
#include "vgpu.h"

/* around every context creation on dev (primary retain of an inactive context, cuCtxCreate*, green
 * contexts): charge what such a context takes (this process's last one, else the container's hint:
 * region/hints.c) and snapshot before; measure and charge after. vgpu_ctx_before returns
 * CUDA_SUCCESS to make the call, else CUDA_ERROR_OUT_OF_MEMORY: the context would not fit, refused
 * before the driver takes its memory. vgpu_ctx_after returns rc, or CUDA_ERROR_OUT_OF_MEMORY when
 * the new context took the container past its limit (measured per process): the caller then
 * destroys the context and calls vgpu_ctx_undo. */
VGPU_HIDDEN CUresult vgpu_ctx_before(int dev, struct vgpu_ctx_probe *p);
VGPU_HIDDEN CUresult vgpu_ctx_after(CUresult rc, struct vgpu_ctx_probe *p);
VGPU_HIDDEN void vgpu_ctx_undo(struct vgpu_ctx_probe *p);
/* around a driver call that may take device memory of its own, outside any allocation (a stream:
 * precharge.c says how much), on a device with a limit: a stand-in for it is charged first, and the
 * call refused with CUDA_ERROR_OUT_OF_MEMORY when the container has no room, as a full GPU would;
 * after the call what it took is measured (the stand-in held unless the reading rules it out) and
 * the stand-in dropped. Measured at every such call, not only near the limit: the readings there
 * are rate-limited, and other processes may fill the container meanwhile. */
VGPU_HIDDEN CUresult vgpu_growth_before(int dev, struct vgpu_growth *g);
VGPU_HIDDEN void vgpu_growth_after(CUresult rc, struct vgpu_growth *g);

#endif
