/* Device memory the driver holds for this process beyond the allocations we charge: CUDA contexts
 * (about 518 MiB each on an H200 with driver 580), their modules, local memory, allocation
 * rounding. Measured, not guessed: this process's own usage as NVML reports it (the host's truth)
 * minus what we already charge, and counted against the limit like any allocation. */
#ifndef VGPU_OVERHEAD_H
#define VGPU_OVERHEAD_H

#include <cuda.h>
#include <stdint.h>

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

/* a stream's piece of driver memory being made (precharge.h): its stand-in, charged before the call */
struct vgpu_growth {
    int dev;
    uint64_t standin; /* charged before the call; 0 when none */
};
/* measure again and settle the charge; no-op without a limit (`limit`: the limit in force on dev, read
 * by the caller); 1 when it measured or had a fresh enough figure. `how`: 0 rate-limited (a report);
 * VGPU_REFRESH_FORCE now, or from a measurement in flight; VGPU_REFRESH_CHARGE for a charge (a forced
 * one may use the last charge's figure within 20 ms, overhead.c says when) */
enum { VGPU_REFRESH_FORCE = 1, VGPU_REFRESH_CHARGE = 2 };
VGPU_HIDDEN int vgpu_overhead_refresh(int dev, int how, uint64_t limit);
/* measure once if this device was never measured (a context made before we could see it), and
 * again (rate-limited) while our NVML entry is not known yet */
VGPU_HIDDEN void vgpu_overhead_ensure(int dev);

/* What the charging floor's pre-charges (precharge.c) ask of the measurement; dev bounds-checked.
 * ctx_estimate: what a new context will take (this process's last one, else the container's hint);
 * room_wanted: PROBE bytes to charge beside it while our NVML entry is unknown and NVML can list (a
 * racy look), else 0; keep_room: that room, charged, kept for the probe (or given back when another
 * thread's is kept or our entry was found meanwhile); standin: charges for contexts and streams
 * being made, not allocations (add 1, drop 0); snapshot: arm p (NVML's device-wide figure while
 * our entry is unknown); measure_ctx: after the context was made, measure (its stand-in taking the
 * growth first), *took = what it added; 1 when the figure can judge it (our own, or no listing at
 * all); forget_ctx: the context was destroyed again; measure_growth: after a stream was made. */
VGPU_HIDDEN uint64_t vgpu_overhead_ctx_estimate(int dev);
VGPU_HIDDEN uint64_t vgpu_overhead_room_wanted(int dev);
VGPU_HIDDEN void vgpu_overhead_keep_room(int dev, uint64_t room);
VGPU_HIDDEN void vgpu_overhead_standin(int dev, uint64_t bytes, int add);
VGPU_HIDDEN void vgpu_overhead_snapshot(struct vgpu_ctx_probe *p);
VGPU_HIDDEN int vgpu_overhead_measure_ctx(struct vgpu_ctx_probe *p, uint64_t limit, uint64_t *took);
VGPU_HIDDEN void vgpu_overhead_forget_ctx(struct vgpu_ctx_probe *p, uint64_t limit);
VGPU_HIDDEN void vgpu_overhead_measure_growth(struct vgpu_growth *g, uint64_t limit);
/* how many processes have a context on dev, as NVML lists them (others' too); -1 when it cannot tell */
VGPU_HIDDEN int vgpu_overhead_gpu_procs(int dev);
/* the percent of NVML's last sample period in which a kernel ran on dev (anyone's); -1 when it cannot tell */
VGPU_HIDDEN int vgpu_overhead_gpu_util(int dev);
/* this process's host pid as NVML reports it, 0 while unknown */
VGPU_HIDDEN unsigned vgpu_overhead_host_pid(void);
VGPU_HIDDEN void vgpu_overhead_atfork_child(void);

#endif
