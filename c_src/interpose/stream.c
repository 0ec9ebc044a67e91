/* Stream creation: the driver keeps its streams' state in device memory of its own, outside any
 * allocation (a 2 MiB piece for every four streams on an H200, kept after they are destroyed).
 * Bracketed by the growth probe (accounting/overhead.h): near the limit a stand-in is charged first
 * and what the call took measured after. */
#include <cuda.h>

#include "accounting/device.h"
#include "accounting/precharge.h"
#include "driver/real.h"

/* the stream is made in the current context; without one the driver's own error answers (a stand-in
 * refused for a context-less call would turn INVALID_CONTEXT into OUT_OF_MEMORY) */
#define STREAM_MADE(call) \
    __extension__({ \
        struct vgpu_growth g_; \
        CUresult rc_ = vgpu_growth_before(vgpu_dev_of_current_ctx(), &g_); \
        if (rc_ != CUDA_SUCCESS && vgpu_dev_current() < 0) { \
            g_.dev = VGPU_DEV_UNKNOWN; \
            rc_ = CUDA_SUCCESS; \
        } \
        if (rc_ == CUDA_SUCCESS) { \
            rc_ = (call); \
            vgpu_growth_after(rc_, &g_); \
        } \
        rc_; \
    })

VGPU_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    __typeof__(&cuStreamCreate) real = REAL(cuStreamCreate);

    return STREAM_MADE(real(phStream, Flags));
}
VGPU_OWN_ALIAS(cuStreamCreate)

VGPU_HIDDEN CUresult vgpu_own_cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    typedef CUresult (*fn)(CUstream *, unsigned int, int);

    return STREAM_MADE(((fn)vgpu_var_fn(VGPU_VAR_cuStreamCreateWithPriority))(phStream, flags, priority));
}
