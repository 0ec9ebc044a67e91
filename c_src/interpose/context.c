/* Context creation: each context costs real device memory outside any allocation (about 518 MiB
 * on an H200 with driver 580). Every way of making one is bracketed by the overhead probe
 * (accounting/overhead.h), which measures what the driver took and charges it to the limit. */
#include <cuda.h>

#include "accounting/device.h"
#include "accounting/precharge.h"
#include "driver/real.h"
#include "interpose/nvml_dev.h"

/* charge what such a context takes and create it (one that would not fit is refused first), then
 * measure; a context over the container's limit is destroyed again (undo) and refused. Without an output
 * (out NULL) the driver creates nothing and answers CUDA_ERROR_INVALID_VALUE: its answer, not a refusal. */
#define CREATED(out, dev, call, undo) \
    __extension__({ \
        struct vgpu_ctx_probe p_; \
        CUresult rc_ = (out) ? vgpu_ctx_before(vgpu_dev_check(dev), &p_) : (call); \
        if ((out) && rc_ == CUDA_SUCCESS) { \
            rc_ = (call); \
            if (vgpu_ctx_after(rc_, &p_) != rc_) { \
                (void)(undo); \
                vgpu_ctx_undo(&p_); \
                rc_ = CUDA_ERROR_OUT_OF_MEMORY; \
            } \
            vgpu_note_host_pid(); /* the probe may just have found it: the container's listings show us */ \
        } \
        rc_; \
    })

static CUresult destroy(CUcontext *pctx)
{
    CUresult rc = REAL(cuCtxDestroy_v2)(*pctx);

    *pctx = NULL;
    return rc;
}

static CUresult destroy_green(CUgreenCtx *out)
{
    static void *fn; /* newer than the vendor's surface: not a slot of ours */
    void *f = __atomic_load_n(&fn, __ATOMIC_RELAXED);

    if (!f) {
        f = vgpu_resolve("cuGreenCtxDestroy", VGPU_LIB_CUDA, 0);
        __atomic_store_n(&fn, f, __ATOMIC_RELAXED);
    }
    if (f)
        ((CUresult(*)(CUgreenCtx))f)(*out);
    *out = NULL;
    return CUDA_SUCCESS;
}

#define VAR(name, type) ((type)vgpu_var_fn(VGPU_VAR_##name))

/* only the first retain of an inactive primary context creates it; later ones are a refcount */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRetain) real = REAL(cuDevicePrimaryCtxRetain);
    unsigned int flags;
    int active = 0;

    if (REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS && active)
        return real(pctx, dev);
    return CREATED(pctx, dev, real(pctx, dev), REAL(cuDevicePrimaryCtxRelease_v2)(dev));
}
VGPU_OWN_ALIAS(cuDevicePrimaryCtxRetain)

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v4) real = REAL(cuCtxCreate_v4);

    return CREATED(pctx, dev, real(pctx, params, flags, dev), destroy(pctx));
}
VGPU_OWN_ALIAS(cuCtxCreate_v4)

/* cuCtxCreate (the first ABI) and _v2 share a signature */
typedef CUresult (*ctx_create_v2_fn)(CUcontext *, unsigned int, CUdevice);

VGPU_HIDDEN CUresult vgpu_own_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return CREATED(pctx, dev, VAR(cuCtxCreate, ctx_create_v2_fn)(pctx, flags, dev), destroy(pctx));
}

VGPU_HIDDEN CUresult vgpu_own_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return CREATED(pctx, dev, VAR(cuCtxCreate_v2, ctx_create_v2_fn)(pctx, flags, dev), destroy(pctx));
}

VGPU_HIDDEN CUresult vgpu_own_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                             CUdevice dev)
{
    typedef CUresult (*fn)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);

    return CREATED(pctx, dev, VAR(cuCtxCreate_v3, fn)(pctx, params, n, flags, dev), destroy(pctx));
}

VGPU_HIDDEN CUresult vgpu_own_cuGreenCtxCreate(CUgreenCtx *out, CUdevResourceDesc desc, CUdevice dev,
                                               unsigned int flags)
{
    typedef CUresult (*fn)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);

    return CREATED(out, dev, VAR(cuGreenCtxCreate, fn)(out, desc, dev, flags), destroy_green(out));
}
