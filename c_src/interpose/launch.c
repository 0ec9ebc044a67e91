/* Kernel and graph launches: the only work added is one predictable branch for the SM limiter. */
#include <cuda.h>

#include "interpose/real.h"
#include "limiter/limiter.h"

#define BEFORE_LAUNCH(stream) \
    do { \
        if (__builtin_expect(vgpu_limiter_enabled, 0)) \
            vgpu_limiter_before_launch(stream); \
    } while (0)

#define LAUNCH_KERNEL_PARAMS \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
        unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra
#define LAUNCH_KERNEL_ARGS f, gx, gy, gz, bx, by, bz, shmem, s, params, extra

VGPU_EXPORT CUresult cuLaunchKernel(LAUNCH_KERNEL_PARAMS)
{
    __typeof__(&cuLaunchKernel) real = REAL(cuLaunchKernel);
    BEFORE_LAUNCH(s);
    return real(LAUNCH_KERNEL_ARGS);
}
VGPU_OWN_ALIAS(cuLaunchKernel)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchKernel_ptsz(LAUNCH_KERNEL_PARAMS)
{
    __typeof__(&cuLaunchKernel) real = vgpu_var_fn(VGPU_VAR_cuLaunchKernel_ptsz);
    BEFORE_LAUNCH(s);
    return real(LAUNCH_KERNEL_ARGS);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    __typeof__(&cuLaunchKernelEx) real = REAL(cuLaunchKernelEx);
    BEFORE_LAUNCH(config ? config->hStream : (CUstream)0);
    return real(config, f, params, extra);
}
VGPU_OWN_ALIAS(cuLaunchKernelEx)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                                    void **extra)
{
    __typeof__(&cuLaunchKernelEx) real = vgpu_var_fn(VGPU_VAR_cuLaunchKernelEx_ptsz);
    BEFORE_LAUNCH(config ? config->hStream : (CUstream)0);
    return real(config, f, params, extra);
}

#define COOP_PARAMS \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
        unsigned int bz, unsigned int shmem, CUstream s, void **params
#define COOP_ARGS f, gx, gy, gz, bx, by, bz, shmem, s, params

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(COOP_PARAMS)
{
    __typeof__(&cuLaunchCooperativeKernel) real = REAL(cuLaunchCooperativeKernel);
    BEFORE_LAUNCH(s);
    return real(COOP_ARGS);
}
VGPU_OWN_ALIAS(cuLaunchCooperativeKernel)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchCooperativeKernel_ptsz(COOP_PARAMS)
{
    __typeof__(&cuLaunchCooperativeKernel) real = vgpu_var_fn(VGPU_VAR_cuLaunchCooperativeKernel_ptsz);
    BEFORE_LAUNCH(s);
    return real(COOP_ARGS);
}

VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    __typeof__(&cuGraphLaunch) real = REAL(cuGraphLaunch);
    BEFORE_LAUNCH(s);
    return real(g, s);
}
VGPU_OWN_ALIAS(cuGraphLaunch)

VGPU_HIDDEN CUresult vgpu_own_cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    __typeof__(&cuGraphLaunch) real = vgpu_var_fn(VGPU_VAR_cuGraphLaunch_ptsz);
    BEFORE_LAUNCH(s);
    return real(g, s);
}
