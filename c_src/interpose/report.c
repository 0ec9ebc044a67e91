/* cuInit and the memory reporting calls: with a limit they show the limit (total) and the
 * budget left (free); without one, the real device. Never 0 bytes; a NULL output gets the driver's
 * own answer, and an NVML call before the application's own nvmlInit NVML's (interpose/nvml_init.c). */
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <nvml.h>

#include "accounting/budget.h"
#include "accounting/device.h"
#include "accounting/overhead.h"
#include "driver/real.h"
#include "interpose/nvml_dev.h"
#include "limits/limits.h"

VGPU_EXPORT CUresult cuInit(unsigned int Flags)
{
    __typeof__(&cuInit) real = REAL(cuInit);
    CUresult rc;

    if (!vgpu_limits_valid()) /* the complaint was printed when libcuda was loaded */
        return CUDA_ERROR_INVALID_VALUE;
    rc = real(Flags);
    if (rc == CUDA_SUCCESS)
        vgpu_dev_forget_count(); /* count the devices again, now that the driver can */
    return rc;
}
VGPU_OWN_ALIAS(cuInit)

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Before a report: a context made before we could see it is measured once, and memory the driver took
 * behind every call we see (a module loaded lazily, local memory grown at a launch) is found again at
 * most every 20 ms, so the figures show what the host's NVML shows for the container. */
static void vgpu_overhead_report(int dev)
{
    vgpu_overhead_ensure(dev);
    vgpu_overhead_refresh(dev, 0, vgpu_budget_limit_peek(dev));
    vgpu_note_host_pid(); /* found by now, perhaps: the container's process listings show us */
}

/* free as the container sees it: what is left of its limit, and never more than the device has */
static uint64_t limited_free(uint64_t used, uint64_t limit, uint64_t real_free)
{
    return min_u64(used < limit ? limit - used : 0, real_free);
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    __typeof__(&cuMemGetInfo_v2) real = REAL(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    uint64_t limit;
    int dev;
    CUresult rc;

    /* NULL is the driver's to judge (580 accepts it and fills the other); what it fills is the limited figure */
    rc = real(free ? &f : 0, total ? &t : 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    dev = vgpu_dev_of_current_ctx();
    limit = dev >= 0 ? vgpu_budget_limit(dev) : 0;
    if (limit) {
        vgpu_overhead_report(dev);
        f = (size_t)limited_free(vgpu_budget_used(dev), limit, f);
        t = (size_t)limit;
    }
    if (free)
        *free = f;
    if (total)
        *total = t;
    return CUDA_SUCCESS;
}
VGPU_OWN_ALIAS(cuMemGetInfo_v2)

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    __typeof__(&cuDeviceTotalMem_v2) real = REAL(cuDeviceTotalMem_v2);
    size_t t = 0;
    uint64_t limit;
    int d;
    CUresult rc;

    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    rc = real(&t, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    d = vgpu_dev_check(dev);
    limit = d >= 0 ? vgpu_budget_limit(d) : 0;
    if (limit)
        t = (size_t)limit;
    *bytes = t;
    return CUDA_SUCCESS;
}
VGPU_OWN_ALIAS(cuDeviceTotalMem_v2)

/* The container's view of an NVML memory report, in place: total = the limit, used = the container's
 * usage (one sum, so used and free agree), free = what is left of the limit. Returns 1 when limited. */
static int limit_nvml_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                           unsigned long long *used)
{
    int dev = vgpu_nvml_dev(device);
    uint64_t limit = dev >= 0 ? vgpu_budget_limit(dev) : 0;

    if (!limit)
        return 0;
    vgpu_overhead_report(dev);
    *used = vgpu_budget_used(dev);
    *free = limited_free(*used, limit, *free);
    *total = limit;
    return 1;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t rc;

    if (!vgpu_nvml_app_open())
        return NVML_ERROR_UNINITIALIZED;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = REAL(nvmlDeviceGetMemoryInfo)(device, memory);
    if (rc == NVML_SUCCESS)
        limit_nvml_view(device, &memory->total, &memory->free, &memory->used);
    return rc;
}
VGPU_OWN_ALIAS(nvmlDeviceGetMemoryInfo)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t rc;

    if (!vgpu_nvml_app_open())
        return NVML_ERROR_UNINITIALIZED;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = REAL(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (rc == NVML_SUCCESS && limit_nvml_view(device, &memory->total, &memory->free, &memory->used))
        memory->reserved = 0;
    return rc;
}
VGPU_OWN_ALIAS(nvmlDeviceGetMemoryInfo_v2)
