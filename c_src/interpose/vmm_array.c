/* Wrappers of VMM physical allocations (cuMemCreate/cuMemRelease) and CUDA arrays. */
#include <stdint.h>

#include <cuda.h>

#include "accounting/charge.h"
#include "accounting/device.h"
#include "accounting/table.h"
#include "driver/real.h"

#define KEY(p) ((uint64_t)(uintptr_t)(p))

/* The location says where the memory lives; a host / host-NUMA location is not device memory,
 * and a context-less thread is fine because no context is consulted. */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    __typeof__(&cuMemCreate) real = REAL(cuMemCreate);
    int dev = vgpu_dev_from_location(prop ? &prop->location : NULL);

    return VGPU_CHARGED(dev, size, VGPU_K_VMM, real(handle, size, prop, flags), *handle);
}
VGPU_OWN_ALIAS(cuMemCreate)

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    return VGPU_UNTRACKED(handle, VGPU_K_VMM, REAL(cuMemRelease)(handle));
}
VGPU_OWN_ALIAS(cuMemRelease)

/* ---- arrays: size estimated from the descriptor (driver padding not visible to us) ---- */
static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 1;
    }
}

static uint64_t at_least_1(uint64_t v)
{
    return v ? v : 1;
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, unsigned channels, CUarray_format f)
{
    uint64_t texel = format_bytes(f) * (channels ? channels : 1);
    return vgpu_mul_sat(vgpu_mul_sat(vgpu_mul_sat(at_least_1(w), at_least_1(h)), at_least_1(d)), texel);
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    __typeof__(&cuArrayCreate_v2) real = REAL(cuArrayCreate_v2);
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->NumChannels, d->Format) : 0;

    return VGPU_CHARGED_CURRENT(bytes, VGPU_K_ARRAY, real(pHandle, d), KEY(*pHandle));
}
VGPU_OWN_ALIAS(cuArrayCreate_v2)

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    __typeof__(&cuArray3DCreate_v2) real = REAL(cuArray3DCreate_v2);
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format) : 0;

    return VGPU_CHARGED_CURRENT(bytes, VGPU_K_ARRAY, real(pHandle, d), KEY(*pHandle));
}
VGPU_OWN_ALIAS(cuArray3DCreate_v2)

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    return VGPU_UNTRACKED(KEY(hArray), VGPU_K_ARRAY, REAL(cuArrayDestroy)(hArray));
}
VGPU_OWN_ALIAS(cuArrayDestroy)

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                            unsigned int numLevels)
{
    __typeof__(&cuMipmappedArrayCreate) real = REAL(cuMipmappedArrayCreate);
    uint64_t bytes = 0;
    unsigned l;

    for (l = 0; d && l < numLevels && l < 64; l++) {
        uint64_t lv = array_bytes(d->Width >> l, d->Height >> l, d->Depth >> l, d->NumChannels, d->Format);
        bytes = (bytes > UINT64_MAX - lv) ? UINT64_MAX : bytes + lv;
    }
    return VGPU_CHARGED_CURRENT(bytes, VGPU_K_MIPMAP, real(pHandle, d, numLevels), KEY(*pHandle));
}
VGPU_OWN_ALIAS(cuMipmappedArrayCreate)

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return VGPU_UNTRACKED(KEY(hMipmappedArray), VGPU_K_MIPMAP, REAL(cuMipmappedArrayDestroy)(hMipmappedArray));
}
VGPU_OWN_ALIAS(cuMipmappedArrayDestroy)
