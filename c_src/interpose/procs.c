/* NVML's process listings inside a limited container: only the container's own processes, as the
 * host's listing would show a container its own (issue 35). A process is the container's when a
 * live slot of its region records its host pid, or it is this process. Each of our processes writes
 * the host pid its identity probe found (accounting/overhead.c) into its own slot, unless the node
 * side filled it already (never overwritten). The memory figures stay as the driver reports them;
 * the count / NVML_ERROR_INSUFFICIENT_SIZE protocol is the driver's. Without a region or a limit on
 * the device, the driver's listing unchanged. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* the unversioned names are the v1 ABI the vendor exports */
#include <stdlib.h>
#include <string.h>

#include <nvml.h>

#include "accounting/budget.h"
#include "accounting/device.h"
#include "accounting/overhead.h"
#include "driver/real.h"
#include "interpose/nvml_dev.h"
#include "region/region.h"

typedef nvmlReturn_t (*listing_fn)(nvmlDevice_t, unsigned int *, void *);

/* our slot records the host pid NVML knows us by (0 = the node side has not filled it) */
VGPU_HIDDEN void vgpu_note_host_pid(void)
{
    vgpu_proc_slot_t *s = vgpu_region_self();
    int32_t hp = (int32_t)vgpu_overhead_host_pid(), zero = 0;

    if (s && hp > 0)
        __atomic_compare_exchange_n(&s->hostpid, &zero, hp, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* 1 when host pid `pid` is this process or a live process of the container (a slot of the region) */
static int container_has(const vgpu_region_t *r, unsigned pid)
{
    unsigned self = vgpu_overhead_host_pid();
    int n = __atomic_load_n(&r->proc_num, __ATOMIC_RELAXED), i;

    if (self && pid == self)
        return 1;
    if (n < 0 || n > VGPU_LEDGER_SLOT)
        n = n < 0 ? 0 : VGPU_LEDGER_SLOT;
    for (i = 0; i < n; i++) {
        const vgpu_proc_slot_t *s = &r->procs[i];
        if (__atomic_load_n(&s->status, __ATOMIC_RELAXED) != 0 &&
            (unsigned)__atomic_load_n(&s->hostpid, __ATOMIC_RELAXED) == pid && pid)
            return 1;
    }
    return 0;
}

/* the driver's whole listing into a new array (*n records of `size`); NVML_SUCCESS or the driver's error */
static nvmlReturn_t whole_listing(listing_fn real, nvmlDevice_t device, size_t size, unsigned char **out,
                                  unsigned *n)
{
    nvmlReturn_t rc;
    int tries;

    *out = NULL;
    for (tries = 0; tries < 4; tries++) {
        unsigned room = 0;
        unsigned char *all;

        rc = real(device, &room, NULL); /* the number there is */
        if (rc == NVML_SUCCESS) {
            *n = 0;
            return NVML_SUCCESS;
        }
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
            return rc;
        room += 8; /* room for processes starting meanwhile */
        if (!(all = calloc(room, size)))
            return NVML_ERROR_MEMORY;
        rc = real(device, &room, all);
        if (rc == NVML_SUCCESS) {
            *out = all;
            *n = room;
            return NVML_SUCCESS;
        }
        free(all);
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
            return rc;
    }
    return rc;
}

/* every record starts with the pid (nvmlProcessInfo_v1_t, _v2_t and nvmlProcessInfo_t alike) */
static nvmlReturn_t own_listing(listing_fn real, nvmlDevice_t device, unsigned int *count, void *infos, size_t size)
{
    vgpu_region_t *r = NULL;
    unsigned char *all;
    unsigned n = 0, kept = 0, i, pid;
    int dev;
    nvmlReturn_t rc;

    if (!vgpu_nvml_app_open()) /* NVML is open for the shim only (interpose/nvml_init.c) */
        return NVML_ERROR_UNINITIALIZED;
    dev = count ? vgpu_nvml_dev(device) : VGPU_DEV_UNKNOWN;
    if (dev >= 0 && vgpu_budget_limit(dev))
        r = vgpu_region_get();
    if (!r) /* no limit, no region, a NULL count, a device this container does not see: the driver's answer */
        return real(device, count, infos);
    vgpu_overhead_ensure(dev); /* our host pid, found when it can be */
    vgpu_note_host_pid();
    rc = whole_listing(real, device, size, &all, &n);
    if (rc != NVML_SUCCESS)
        return rc;
    for (i = 0; i < n; i++) {
        memcpy(&pid, all + (size_t)i * size, sizeof pid);
        if (container_has(r, pid)) {
            if (kept != i)
                memmove(all + (size_t)kept * size, all + (size_t)i * size, size);
            kept++;
        }
    }
    if (*count < kept)
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (kept && !infos)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (kept)
        memcpy(infos, all, (size_t)kept * size);
    if (rc != NVML_ERROR_INVALID_ARGUMENT)
        *count = kept;
    free(all);
    return rc;
}

#define OWN_LISTING(name, record)                                                                \
    VGPU_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, record *infos)       \
    {                                                                                            \
        return own_listing((listing_fn)vgpu_real_fn(VGPU_IDX_##name), device, count, infos,     \
                           sizeof(record));                                                      \
    }                                                                                            \
    VGPU_OWN_ALIAS(name)

OWN_LISTING(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
OWN_LISTING(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
OWN_LISTING(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
OWN_LISTING(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t)
OWN_LISTING(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)

/* The spellings the vendor does not export (VARIANT lines): handed out by dlsym only, so a program
 * that links to them directly reaches the driver's listing. _v3's record is the _v2 layout. */
#define VARIANT_LISTING(name, record)                                                               \
    VGPU_HIDDEN nvmlReturn_t vgpu_own_##name(nvmlDevice_t device, unsigned int *count, record *infos) \
    {                                                                                               \
        return own_listing((listing_fn)vgpu_var_fn(VGPU_VAR_##name), device, count, infos,          \
                           sizeof(record));                                                         \
    }

VARIANT_LISTING(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
VARIANT_LISTING(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
VARIANT_LISTING(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
VARIANT_LISTING(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)
