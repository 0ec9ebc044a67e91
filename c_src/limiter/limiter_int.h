/* Internals of the SM limiter: the driver calls it needs (one table, so tests can run the same
 * limiter over a simulated GPU) and its tunables. */
#ifndef VGPU_LIMITER_INT_H
#define VGPU_LIMITER_INT_H

#include <stddef.h>

#include <cuda.h>

#include "vgpu.h"

typedef struct {
    CUresult (*ctx_get_device)(CUdevice *dev);
    CUresult (*ctx_get_current)(CUcontext *ctx);
    CUresult (*event_create)(CUevent *ev, unsigned int flags);
    CUresult (*event_record)(CUevent ev, CUstream s);
    CUresult (*event_query)(CUevent ev);
    CUresult (*event_sync)(CUevent ev);
    CUresult (*event_elapsed)(float *ms, CUevent a, CUevent b);
    CUresult (*stream_is_capturing)(CUstream s, CUstreamCaptureStatus *st);
    CUresult (*device_count)(int *n);
    int (*device_key)(int ordinal, char *out, size_t n); /* the device's UUID text, 0 on success */
    int (*gpu_procs)(int ordinal); /* processes with a context on the device, the GPU's own count (NVML); -1 unknown */
    int (*gpu_util)(int ordinal);  /* percent of the GPU's recent time with a kernel running (NVML); -1 unknown */
    int (*sm_count)(int ordinal);  /* the device's SMs; -1 unknown (0 entry: unknown) */
    CUresult (*occupancy)(int *blocks, CUfunction f, int threads, size_t smem); /* blocks one SM holds; may be 0 */
} vgpu_limiter_ops_t;

/* fills the table on first use; 0 when every entry is there (ops.c, or a test's simulated GPU) */
VGPU_HIDDEN int vgpu_limiter_ops_load(vgpu_limiter_ops_t *ops);

/* what a launch is charged, from VGPU_SM_CHARGE: its time (default, HAMi's meaning) or its time times
 * the share of the SMs its grid occupies */
enum { VGPU_CHARGE_TIME = 0, VGPU_CHARGE_OCCUPANCY = 1 };

/* policy from GPU_CORE_UTILIZATION_POLICY */
enum { VGPU_POLICY_DEFAULT = 0, VGPU_POLICY_FORCE = 1, VGPU_POLICY_DISABLE = 2 };

/* the percent in force for dev now (0 = do not throttle): region > env, policy, monitor switch */
VGPU_HIDDEN int vgpu_limiter_percent(int dev);
/* read the environment and set vgpu_limiter_enabled (the constructor runs it; env only) */
VGPU_HIDDEN void vgpu_limiter_load_env(void);

#endif
