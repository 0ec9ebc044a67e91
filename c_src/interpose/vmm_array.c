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
    CUresult rc = vgpu_charge(dev, size);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(handle, size, prop, flags);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? *handle : 0, VGPU_K_VMM, dev, size);
    return rc;
}
VGPU_OWN_ALIAS(cuMemCreate)

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    __typeof__(&cuMemRelease) real = REAL(cuMemRelease);
    struct vgpu_tracked t = vgpu_untrack(handle, VGPU_K_VMM);
    CUresult rc = real(handle);

    vgpu_untrack_done(rc, handle, VGPU_K_VMM, t);
    return rc;
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

static CUresult array_create(CUresult (*call)(void *out, const void *desc), CUarray *out, const void *desc,
                             uint64_t bytes)
{
    int dev = vgpu_dev_current();
    CUresult rc = vgpu_charge(dev, bytes);

    if (rc != CUDA_SUCCESS)
        return rc;
    rc = call(out, desc);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? KEY(*out) : 0, VGPU_K_ARRAY, dev, bytes);
    return rc;
}

static CUresult call_array2d(void *out, const void *desc)
{
    return REAL(cuArrayCreate_v2)(out, desc);
}

static CUresult call_array3d(void *out, const void *desc)
{
    return REAL(cuArray3DCreate_v2)(out, desc);
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->NumChannels, d->Format) : 0;
    return array_create(call_array2d, pHandle, d, bytes);
}
VGPU_OWN_ALIAS(cuArrayCreate_v2)

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format) : 0;
    return array_create(call_array3d, pHandle, d, bytes);
}
VGPU_OWN_ALIAS(cuArray3DCreate_v2)

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    __typeof__(&cuArrayDestroy) real = REAL(cuArrayDestroy);
    struct vgpu_tracked t = vgpu_untrack(KEY(hArray), VGPU_K_ARRAY);
    CUresult rc = real(hArray);

    vgpu_untrack_done(rc, KEY(hArray), VGPU_K_ARRAY, t);
    return rc;
}
VGPU_OWN_ALIAS(cuArrayDestroy)

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                            unsigned int numLevels)
{
    __typeof__(&cuMipmappedArrayCreate) real = REAL(cuMipmappedArrayCreate);
    uint64_t bytes = 0;
    int dev = vgpu_dev_current();
    unsigned l;
    CUresult rc;

    for (l = 0; d && l < numLevels && l < 64; l++) {
        uint64_t lv = array_bytes(d->Width >> l, d->Height >> l, d->Depth >> l, d->NumChannels, d->Format);
        bytes = (bytes > UINT64_MAX - lv) ? UINT64_MAX : bytes + lv;
    }
    rc = vgpu_charge(dev, bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(pHandle, d, numLevels);
    vgpu_settle(rc, rc == CUDA_SUCCESS ? KEY(*pHandle) : 0, VGPU_K_MIPMAP, dev, bytes);
    return rc;
}
VGPU_OWN_ALIAS(cuMipmappedArrayCreate)

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    __typeof__(&cuMipmappedArrayDestroy) real = REAL(cuMipmappedArrayDestroy);
    struct vgpu_tracked t = vgpu_untrack(KEY(hMipmappedArray), VGPU_K_MIPMAP);
    CUresult rc = real(hMipmappedArray);

    vgpu_untrack_done(rc, KEY(hMipmappedArray), VGPU_K_MIPMAP, t);
    return rc;
}
VGPU_OWN_ALIAS(cuMipmappedArrayDestroy)
