/* cuGetProcAddress(_v2): the driver keeps deciding which version a (name, cudaVersion, flags)
 * query means (per-thread-stream variants included); we only swap the pointer it returns for
 * our wrapper when it is the real address of a function we wrap. */
#include <cuda.h>
#if CUDA_VERSION < 12000
#error "the shim needs CUDA >= 12.0 headers (cuGetProcAddress_v2); use the nvidia-cuda-runtime wheel's cuda.h"
#endif
#undef cuGetProcAddress /* cuda.h maps it to _v2; we also export the original 4-argument one */

#include "driver/real.h"
#include "interpose/wrapped.h"
#include "log/log.h"

static const struct vgpu_handouts own; /* ours, at the end of the file (wrapped.h) */

static void *answer(const char *symbol, void *p, int version, cuuint64_t flags)
{
    void *w = vgpu_swap_for_wrapper(p, &own);

    if (VGPU_UNLIKELY(vgpu_debug_dlsym))
        vgpu_log(VGPU_LOG_ERROR, "cuGetProcAddress(%s, %d, %#llx) -> %p%s", symbol ? symbol : "(null)", version,
                 (unsigned long long)flags, w, w != p ? " (our wrapper)" : "");
    return w;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    __typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);

    if (rc == CUDA_SUCCESS && pfn)
        *pfn = answer(symbol, *pfn, cudaVersion, flags);
    return rc;
}
VGPU_OWN_ALIAS(cuGetProcAddress_v2)

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CUresult (*real)(const char *, void **, int, cuuint64_t) = vgpu_real_fn(VGPU_IDX_cuGetProcAddress);
    CUresult rc = real(symbol, pfn, cudaVersion, flags);

    if (rc == CUDA_SUCCESS && pfn)
        *pfn = answer(symbol, *pfn, cudaVersion, flags);
    return rc;
}
VGPU_OWN_ALIAS(cuGetProcAddress)

static const struct vgpu_handouts own = {NULL, (void *)vgpu_own_cuGetProcAddress, (void *)vgpu_own_cuGetProcAddress_v2};
