/* The application's own NVML session. The shim opens NVML for itself (accounting/overhead.c) and NVML counts
 * its openings, so without this the application would find NVML open although it never called nvmlInit: a
 * wrapped call would then reach the driver with whatever handle it was given (a junk one faults there) where
 * the driver alone answers NVML_ERROR_UNINITIALIZED, and one nvmlShutdown too many would close the shim's
 * session under it. Counted here, the application sees exactly its own openings.
 *
 * NVML calls its own entry points through the global scope (the fake NVML's nvmlInit_v2 reaches
 * nvmlInitWithFlags so, as the real one's evidently does), and those calls land here too, the shim's own
 * opening among them: a call made while this thread is already inside an opening or shutdown (ours or the
 * shim's, vgpu_nvml_inner) is NVML's, passed on uncounted. Without that, on the H200 the shim's own session
 * counted as the application's, and a junk handle before the application's nvmlInit faulted. */
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

/* the real call, with this thread marked inside it */
#define INNER(call) \
    __extension__({ \
        nvmlReturn_t rc_; \
        vgpu_nvml_inner++; \
        rc_ = (call); \
        vgpu_nvml_inner--; \
        rc_; \
    })

VGPU_EXPORT nvmlReturn_t nvmlInit(void)
{
    return vgpu_nvml_inner ? REAL(nvmlInit)() : opened(INNER(REAL(nvmlInit)()));
}
VGPU_OWN_ALIAS(nvmlInit)

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return vgpu_nvml_inner ? REAL(nvmlInit_v2)() : opened(INNER(REAL(nvmlInit_v2)()));
}
VGPU_OWN_ALIAS(nvmlInit_v2)

VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    return vgpu_nvml_inner ? REAL(nvmlInitWithFlags)(flags) : opened(INNER(REAL(nvmlInitWithFlags)(flags)));
}
VGPU_OWN_ALIAS(nvmlInitWithFlags)

/* one shutdown for each of the application's openings reaches NVML; one more is NVML's own answer to a
 * shutdown of nothing, and the shim's session stays open */
VGPU_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    unsigned int n = __atomic_load_n(&app_opens, __ATOMIC_ACQUIRE);

    if (vgpu_nvml_inner)
        return REAL(nvmlShutdown)();
    do {
        if (!n)
            return NVML_ERROR_UNINITIALIZED;
    } while (!__atomic_compare_exchange_n(&app_opens, &n, n - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return INNER(REAL(nvmlShutdown)());
}
VGPU_OWN_ALIAS(nvmlShutdown)
