/* Which of the container's CUDA devices an NVML device is, for the NVML wrappers (report.c, procs.c). */
#include <string.h>

#include <cuda.h>
#include <nvml.h>

#include "accounting/device.h"
#include "driver/real.h"
#include "interpose/nvml_dev.h"

/* The container's CUDA ordinal of an NVML device, matched by UUID: NVML numbers devices as the
 * host does, CUDA as CUDA_VISIBLE_DEVICES orders them. Before the CUDA driver can name its devices
 * (no cuInit yet), NVML's index stands in, as HAMi's own containers see the same devices in the
 * same order. */
VGPU_HIDDEN int vgpu_nvml_dev(nvmlDevice_t device)
{
    char want[96], have[96];
    unsigned int idx = 0;
    int n = 0, i;

    if (REAL(nvmlDeviceGetUUID)(device, want, sizeof want) == NVML_SUCCESS &&
        REAL(cuDeviceGetCount)(&n) == CUDA_SUCCESS) {
        for (i = 0; i < n && i < VGPU_MAX_DEVICES; i++)
            if (vgpu_dev_uuid(i, have, sizeof have) == 0 && strcmp(have, want) == 0)
                return i;
        return VGPU_DEV_UNKNOWN; /* a device this container's CUDA does not see */
    }
    if (REAL(nvmlDeviceGetIndex)(device, &idx) != NVML_SUCCESS || idx >= VGPU_MAX_DEVICES)
        return VGPU_DEV_UNKNOWN;
    return (int)idx;
}
