/* Device memory the driver holds for this process beyond the allocations we charge: CUDA contexts
 * (about 518 MiB each on an H200 with driver 580), their modules, local memory, allocation
 * rounding. Measured, not guessed: this process's own usage as NVML reports it (the host's truth)
 * minus what we already charge, and counted against the limit like any allocation. */
#ifndef VGPU_OVERHEAD_H
#define VGPU_OVERHEAD_H

#include <cuda.h>

#include "vgpu.h"

/* what a context creation looked like before the real call (NVML snapshot) */
struct vgpu_ctx_probe {
    int dev;
    int armed;
    int delta;                      /* used_before was read (our NVML entry is not known yet) */
    unsigned long long used_before; /* device-wide used bytes, NVML */
    unsigned long long added;       /* what the creation added to the fallback */
    uint64_t precharge;             /* charged before the call: what such a context takes */
};

/* around every context creation on dev (primary retain of an inactive context, cuCtxCreate*,
 * green contexts): charge what such a context takes (this process's last one, else the container's
 * hint: region/hints.c) and snapshot before; measure and charge after. before_ctx returns
 * CUDA_SUCCESS to make the call, else CUDA_ERROR_OUT_OF_MEMORY: the context would not fit, refused
 * before the driver takes its memory. after_ctx returns rc, or CUDA_ERROR_OUT_OF_MEMORY when the
 * new context took the container past its limit (measured per process): the caller then destroys
 * the context and calls vgpu_overhead_undo_ctx. */
VGPU_HIDDEN CUresult vgpu_overhead_before_ctx(int dev, struct vgpu_ctx_probe *p);
VGPU_HIDDEN CUresult vgpu_overhead_after_ctx(CUresult rc, struct vgpu_ctx_probe *p);
VGPU_HIDDEN void vgpu_overhead_undo_ctx(struct vgpu_ctx_probe *p);
/* around a driver call that may take device memory of its own, outside any allocation (a stream:
 * overhead.c says how much), on a device with a limit: a stand-in for it is charged first, and the
 * call refused with CUDA_ERROR_OUT_OF_MEMORY when the container has no room, as a full GPU would;
 * after the call what it took is measured (the stand-in held unless the reading rules it out) and
 * the stand-in dropped. Measured at every such call, not only near the limit: the readings there
 * are rate-limited, and other processes may fill the container meanwhile. */
struct vgpu_growth {
    int dev;
    uint64_t standin; /* charged before the call; 0 when none */
};
VGPU_HIDDEN CUresult vgpu_overhead_before_growth(int dev, struct vgpu_growth *g);
VGPU_HIDDEN void vgpu_overhead_after_growth(CUresult rc, struct vgpu_growth *g);
/* measure again (rate-limited unless force) and settle the charge; no-op without a limit on dev;
 * 1 when it measured */
VGPU_HIDDEN int vgpu_overhead_refresh(int dev, int force);
/* measure once if this device was never measured (a context made before we could see it), and
 * again (rate-limited) while our NVML entry is not known yet */
VGPU_HIDDEN void vgpu_overhead_ensure(int dev);
/* how many processes have a context on dev, as NVML lists them (others' too); -1 when it cannot tell */
VGPU_HIDDEN int vgpu_overhead_gpu_procs(int dev);
/* this process's host pid as NVML reports it, 0 while unknown */
VGPU_HIDDEN unsigned vgpu_overhead_host_pid(void);
VGPU_HIDDEN void vgpu_overhead_atfork_child(void);

#endif
