/* The limiter's driver calls, from the real libcuda. Event and capture-query entry points are not
 * part of the interposed surface, so they are looked up directly (optional: a driver without them
 * leaves the limiter off rather than failing launches). */
#include "accounting/device.h"
#include "accounting/overhead.h"
#include "driver/real.h"
#include "limiter/limiter_int.h"

static void *sym(const char *name)
{
    return vgpu_lib_handle(VGPU_LIB_CUDA) ? vgpu_resolve(name, VGPU_LIB_CUDA, 0) : 0;
}

static int sm_count(int ordinal)
{
    CUdevice d;
    int n = -1;

    if (REAL(cuDeviceGet)(&d, ordinal) != CUDA_SUCCESS ||
        REAL(cuDeviceGetAttribute)(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d) != CUDA_SUCCESS)
        return -1;
    return n;
}

VGPU_HIDDEN int vgpu_limiter_ops_load(vgpu_limiter_ops_t *ops)
{
    void *elapsed;

    if (vgpu_lib_init(VGPU_LIB_CUDA) != 0)
        return -1;
    ops->ctx_get_device = REAL(cuCtxGetDevice);
    ops->ctx_get_current = REAL(cuCtxGetCurrent);
    ops->device_count = REAL(cuDeviceGetCount);
    ops->device_key = vgpu_dev_uuid;
    ops->gpu_procs = vgpu_overhead_gpu_procs;
    ops->gpu_util = vgpu_overhead_gpu_util;
    ops->event_create = REAL(cuEventCreate);
    ops->event_record = (__typeof__(ops->event_record))sym("cuEventRecord");
    ops->event_query = (__typeof__(ops->event_query))sym("cuEventQuery");
    ops->event_sync = (__typeof__(ops->event_sync))sym("cuEventSynchronize");
    elapsed = sym("cuEventElapsedTime_v2"); /* CUDA 12.8+; the unversioned one is the old ABI */
    ops->event_elapsed = (__typeof__(ops->event_elapsed))(elapsed ? elapsed : sym("cuEventElapsedTime"));
    ops->stream_is_capturing = (__typeof__(ops->stream_is_capturing))sym("cuStreamIsCapturing");
    ops->sm_count = sm_count;
    ops->occupancy = (__typeof__(ops->occupancy))sym("cuOccupancyMaxActiveBlocksPerMultiprocessor"); /* optional */
    return (ops->event_record && ops->event_query && ops->event_sync && ops->event_elapsed &&
            ops->stream_is_capturing && !vgpu_is_not_found_stub((void *)ops->event_create))
               ? 0
               : -1;
}
