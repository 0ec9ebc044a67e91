/* Launch hooks for the SM limiter and the monitor's signals (limiter.c). Wrappers call them
 * around the real launch (the pair measures a sampled launch's GPU time):
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_before_launch(stream, is_graph, shape, grid);
 *   rc = real(...);
 *   if (__builtin_expect(vgpu_limiter_enabled, 0)) vgpu_limiter_after_launch(stream); */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include <stdint.h>

#include <cuda.h>

#include "vgpu.h"

VGPU_HIDDEN extern int vgpu_limiter_enabled;

/* a kernel launch's grid: what VGPU_SM_CHARGE=occupancy needs to know how much of the SMs it holds */
typedef struct {
    CUfunction f;
    unsigned long long blocks; /* gridDim x * y * z */
    unsigned threads;          /* blockDim x * y * z */
    unsigned smem;             /* dynamic shared memory per block */
} vgpu_grid_t;

/* shape: a word naming what is launched (the kernel and its grid, or the graph), so that launches
 * of the same work compare (vgpu_launch_shape); grid: the kernel's, 0 for a graph or when unknown */
VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream s, int graph, uint64_t shape, const vgpu_grid_t *grid);
VGPU_HIDDEN void vgpu_limiter_after_launch(CUstream s);
/* around a wait for the GPU (cuCtxSynchronize, cuStreamSynchronize): the process has work queued,
 * so it is busy on the activity board meanwhile. before returns what after takes (-1: nothing). */
VGPU_HIDDEN int vgpu_limiter_before_wait(void);
VGPU_HIDDEN void vgpu_limiter_after_wait(int dev);
/* 1 when some SM limit may throttle this process (the env has one and the policy allows it) */
VGPU_HIDDEN int vgpu_limiter_throttles(void);

static inline uint64_t vgpu_launch_shape(const void *what, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shmem)
{
    uint64_t h = (uint64_t)(uintptr_t)what * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)gx << 32 | gy) * 0xc2b2ae3d27d4eb4full;
    h ^= ((uint64_t)gz << 32 | bx) * 0x165667b19e3779f9ull;
    h ^= ((uint64_t)(by * 1024u + bz) << 32 | shmem) * 0x27d4eb2f165667c5ull;
    return h;
}

#endif
