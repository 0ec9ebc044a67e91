/* The older ABIs of the allocating and reporting calls, as a program or an old runtime reaches
 * them by dlsym or cuGetProcAddress with an old version (VARIANT lines of hooks.def; not
 * exported): 32-bit sizes and device pointers. Charged like their _v2 forms; the reports are the
 * _v2 wrappers' answers clamped to 32 bits. */
#include <limits.h>
#include <stdint.h>

#include <cuda.h>

#include "accounting/charge.h"
#include "accounting/table.h"
#include "driver/real.h"

typedef unsigned int dptr_v1; /* CUdeviceptr before CUDA 3.2 */

typedef struct {
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
} array_desc_v1;

typedef struct {
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
} array3d_desc_v1;

/* the _v2 reporting wrappers (interpose/report.c), by their hidden aliases */
VGPU_HIDDEN CUresult vgpu_own_cuMemGetInfo_v2(size_t *free, size_t *total);
VGPU_HIDDEN CUresult vgpu_own_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

#define VAR(name, type) ((type)vgpu_var_fn(VGPU_VAR_##name))
#define KEY(p) ((uint64_t)(uintptr_t)(p))

VGPU_HIDDEN CUresult vgpu_own_cuMemAlloc(dptr_v1 *dptr, unsigned int bytesize)
{
    return VGPU_CHARGED_CURRENT(bytesize, VGPU_K_DPTR,
                                VAR(cuMemAlloc, CUresult(*)(dptr_v1 *, unsigned int))(dptr, bytesize), *dptr);
}

VGPU_HIDDEN CUresult vgpu_own_cuMemFree(dptr_v1 dptr)
{
    return VGPU_UNTRACKED(dptr, VGPU_K_DPTR, VAR(cuMemFree, CUresult(*)(dptr_v1))(dptr));
}

/* the real pitch is known only after the call: charged as width * height (padding is caught by
 * the physical-overhead measurement) */
VGPU_HIDDEN CUresult vgpu_own_cuMemAllocPitch(dptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                                              unsigned int esz)
{
    typedef CUresult (*fn)(dptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);

    return VGPU_CHARGED_CURRENT((uint64_t)w * h, VGPU_K_DPTR, VAR(cuMemAllocPitch, fn)(dptr, pitch, w, h, esz),
                                *dptr);
}

VGPU_HIDDEN CUresult vgpu_own_cuArrayCreate(CUarray *out, const array_desc_v1 *d)
{
    uint64_t bytes = d ? vgpu_mul_sat((uint64_t)(d->Width ? d->Width : 1) * (d->Height ? d->Height : 1),
                                      d->NumChannels ? d->NumChannels : 1)
                       : 0;

    return VGPU_CHARGED_CURRENT(bytes, VGPU_K_ARRAY,
                                VAR(cuArrayCreate, CUresult(*)(CUarray *, const array_desc_v1 *))(out, d), KEY(*out));
}

VGPU_HIDDEN CUresult vgpu_own_cuArray3DCreate(CUarray *out, const array3d_desc_v1 *d)
{
    uint64_t bytes = d ? vgpu_mul_sat(vgpu_mul_sat((uint64_t)(d->Width ? d->Width : 1) * (d->Height ? d->Height : 1),
                                                   d->Depth ? d->Depth : 1),
                                      d->NumChannels ? d->NumChannels : 1)
                       : 0;

    return VGPU_CHARGED_CURRENT(bytes, VGPU_K_ARRAY,
                                VAR(cuArray3DCreate, CUresult(*)(CUarray *, const array3d_desc_v1 *))(out, d),
                                KEY(*out));
}

static unsigned int clamp32(size_t v)
{
    return v > UINT_MAX ? UINT_MAX : (unsigned int)v;
}

VGPU_HIDDEN CUresult vgpu_own_cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    size_t f, t;
    CUresult rc;

    /* NULL: the driver's own v1 answers (the real one says 201 with or without a context, where its v2
     * accepts NULL and succeeds: a success here would then write through the NULL) */
    if (!free || !total)
        return VAR(cuMemGetInfo, CUresult(*)(unsigned int *, unsigned int *))(free, total);
    rc = vgpu_own_cuMemGetInfo_v2(&f, &t);
    if (rc != CUDA_SUCCESS)
        return rc;
    *free = clamp32(f);
    *total = clamp32(t);
    return CUDA_SUCCESS;
}

VGPU_HIDDEN CUresult vgpu_own_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t t;
    CUresult rc;

    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    rc = vgpu_own_cuDeviceTotalMem_v2(&t, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = clamp32(t);
    return rc;
}
