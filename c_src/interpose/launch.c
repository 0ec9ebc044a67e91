/* Kernel and graph launches: one predictable branch before and after the real call into the
 * limiter (limiter/limiter.c): the monitor's hold and kernel-time stamp, the node's activity board,
 * and the SM limiter, which charges an estimate or (one launch in 32) brackets the launch with
 * events to measure it. Synchronisation calls tell the board that the process has work queued. */
#include <cuda.h>

#include "driver/real.h"
#include "limiter/limiter.h"

#define LIMITED_LAUNCH_KIND(stream, graph, shape, grid, call) \
    do { \
        CUresult rc_; \
        if (__builtin_expect(vgpu_limiter_enabled, 0)) \
            vgpu_limiter_before_launch(stream, graph, shape, grid); \
        rc_ = (call); \
        if (__builtin_expect(vgpu_limiter_enabled, 0)) \
            vgpu_limiter_after_launch(stream); \
        return rc_; \
    } while (0)
#define LIMITED_LAUNCH(stream, shape, grid, call) LIMITED_LAUNCH_KIND(stream, 0, shape, grid, call)
#define KERNEL_SHAPE vgpu_launch_shape((const void *)f, gx, gy, gz, bx, by, bz, shmem)
#define KERNEL_GRID (&(vgpu_grid_t){f, (unsigned long long)gx * gy * gz, bx * by * bz, shmem})
#define EX_SHAPE \
    (config ? vgpu_launch_shape((const void *)f, config->gridDimX, config->gridDimY, config->gridDimZ, \
                                config->blockDimX, config->blockDimY, config->blockDimZ, config->sharedMemBytes) \
            : (uint64_t)(uintptr_t)f)
#define EX_GRID \
    (config ? &(vgpu_grid_t){f, (unsigned long long)config->gridDimX * config->gridDimY * config->gridDimZ, \
                             config->blockDimX * config->blockDimY * config->blockDimZ, config->sharedMemBytes} \
            : (const vgpu_grid_t *)0)

#define LAUNCH_KERNEL_PARAMS \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
        unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra
#define LAUNCH_KERNEL_ARGS f, gx, gy, gz, bx, by, bz, shmem, s, params, extra

VGPU_EXPORT CUresult cuLaunchKernel(LAUNCH_KERNEL_PARAMS)
{
    __typeof__(&cuLaunchKernel) real = REAL(cuLaunchKernel);
    LIMITED_LAUNCH(s, KERNEL_SHAPE, KERNEL_GRID, real(LAUNCH_KERNEL_ARGS));
}
VGPU_OWN_ALIAS(cuLaunchKernel)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchKernel_ptsz(LAUNCH_KERNEL_PARAMS)
{
    __typeof__(&cuLaunchKernel) real = vgpu_var_fn(VGPU_VAR_cuLaunchKernel_ptsz);
    LIMITED_LAUNCH(s, KERNEL_SHAPE, KERNEL_GRID, real(LAUNCH_KERNEL_ARGS));
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    __typeof__(&cuLaunchKernelEx) real = REAL(cuLaunchKernelEx);
    LIMITED_LAUNCH(config ? config->hStream : (CUstream)0, EX_SHAPE, EX_GRID, real(config, f, params, extra));
}
VGPU_OWN_ALIAS(cuLaunchKernelEx)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                                    void **extra)
{
    __typeof__(&cuLaunchKernelEx) real = vgpu_var_fn(VGPU_VAR_cuLaunchKernelEx_ptsz);
    LIMITED_LAUNCH(config ? config->hStream : (CUstream)0, EX_SHAPE, EX_GRID, real(config, f, params, extra));
}

#define COOP_PARAMS \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
        unsigned int bz, unsigned int shmem, CUstream s, void **params
#define COOP_ARGS f, gx, gy, gz, bx, by, bz, shmem, s, params

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(COOP_PARAMS)
{
    __typeof__(&cuLaunchCooperativeKernel) real = REAL(cuLaunchCooperativeKernel);
    LIMITED_LAUNCH(s, KERNEL_SHAPE, KERNEL_GRID, real(COOP_ARGS));
}
VGPU_OWN_ALIAS(cuLaunchCooperativeKernel)

VGPU_HIDDEN CUresult vgpu_own_cuLaunchCooperativeKernel_ptsz(COOP_PARAMS)
{
    __typeof__(&cuLaunchCooperativeKernel) real = vgpu_var_fn(VGPU_VAR_cuLaunchCooperativeKernel_ptsz);
    LIMITED_LAUNCH(s, KERNEL_SHAPE, KERNEL_GRID, real(COOP_ARGS));
}

VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    __typeof__(&cuGraphLaunch) real = REAL(cuGraphLaunch);
    LIMITED_LAUNCH_KIND(s, 1, (uint64_t)(uintptr_t)g, (const vgpu_grid_t *)0, real(g, s));
}
VGPU_OWN_ALIAS(cuGraphLaunch)

VGPU_HIDDEN CUresult vgpu_own_cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    __typeof__(&cuGraphLaunch) real = vgpu_var_fn(VGPU_VAR_cuGraphLaunch_ptsz);
    LIMITED_LAUNCH_KIND(s, 1, (uint64_t)(uintptr_t)g, (const vgpu_grid_t *)0, real(g, s));
}

/* a thread waiting for the GPU: its process is busy on the activity board until the wait ends */
#define WAITING(call) \
    do { \
        CUresult rc_; \
        int held_ = __builtin_expect(vgpu_limiter_enabled, 0) ? vgpu_limiter_before_wait() : -1; \
        rc_ = (call); \
        if (held_ >= 0) \
            vgpu_limiter_after_wait(held_); \
        return rc_; \
    } while (0)

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    __typeof__(&cuCtxSynchronize) real = REAL(cuCtxSynchronize);
    WAITING(real());
}
VGPU_OWN_ALIAS(cuCtxSynchronize)

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    __typeof__(&cuStreamSynchronize) real = REAL(cuStreamSynchronize);
    WAITING(real(s));
}
VGPU_OWN_ALIAS(cuStreamSynchronize)

VGPU_HIDDEN CUresult vgpu_own_cuStreamSynchronize_ptsz(CUstream s)
{
    __typeof__(&cuStreamSynchronize) real = vgpu_var_fn(VGPU_VAR_cuStreamSynchronize_ptsz);
    WAITING(real(s));
}
