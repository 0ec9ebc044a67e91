/* The application's own NVML session. The shim opens NVML for itself (accounting/overhead.c) and NVML counts
 * its openings, so without this the application would find NVML open although it never called nvmlInit: a
 * wrapped call would then reach the driver with whatever handle it was given (a junk one faults there) where
 * the driver alone answers NVML_ERROR_UNINITIALIZED, and one nvmlShutdown too many would close the shim's
 * session under it. Counted here, the application sees exactly its own openings. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* nvmlInit is the first ABI, a symbol of its own */
#include <nvml.h>

#include "driver/real.h"
#include "interpose/nvml_dev.h"

static unsigned int app_opens; /* the application's successful nvmlInit* calls not yet shut down */

VGPU_HIDDEN int vgpu_nvml_app_open(void)
{
    return __atomic_load_n(&app_opens, __ATOMIC_ACQUIRE) != 0;
}

static nvmlReturn_t opened(nvmlReturn_t rc)
{
    if (rc == NVML_SUCCESS)
        __atomic_add_fetch(&app_opens, 1, __ATOMIC_ACQ_REL);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlInit(void)
{
    return opened(REAL(nvmlInit)());
}
VGPU_OWN_ALIAS(nvmlInit)

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return opened(REAL(nvmlInit_v2)());
}
VGPU_OWN_ALIAS(nvmlInit_v2)

VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    return opened(REAL(nvmlInitWithFlags)(flags));
}
VGPU_OWN_ALIAS(nvmlInitWithFlags)

/* one shutdown for each of the application's openings reaches NVML; one more is NVML's own answer to a
 * shutdown of nothing, and the shim's session stays open */
VGPU_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    unsigned int n = __atomic_load_n(&app_opens, __ATOMIC_ACQUIRE);

    do {
        if (!n)
            return NVML_ERROR_UNINITIALIZED;
    } while (!__atomic_compare_exchange_n(&app_opens, &n, n - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return REAL(nvmlShutdown)();
}
VGPU_OWN_ALIAS(nvmlShutdown)
