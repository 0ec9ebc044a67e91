/* The fake GPU's SMs: how many there are and how many blocks of one shape an SM holds at once, as an H200's
 * SM does (2048 threads, 32 blocks, 228 KiB of shared memory). The one home of that rule: fake_cuda.c answers
 * CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT and cuOccupancyMaxActiveBlocksPerMultiprocessor with it, and the
 * SM model (FAKE_SM_MODEL, fake_events.c and sim_gpu.h) places kernels with it, so what the shim's occupancy
 * charge asks the driver is what the simulated GPU does. */
#ifndef FAKE_SM_H
#define FAKE_SM_H

#include <stddef.h>

#define FAKE_SMS 132
#define FAKE_SM_THREADS 2048
#define FAKE_SM_BLOCKS 32
#define FAKE_SM_SMEM 233472 /* 228 KiB */

/* the blocks of `threads` threads (1..1024) and `smem` bytes of shared memory one SM holds; 0 when one such
 * block does not fit in an SM */
static inline int fake_blocks_per_sm(int threads, size_t smem)
{
    int by_threads = FAKE_SM_THREADS / threads, by_smem = smem ? (int)(FAKE_SM_SMEM / smem) : FAKE_SM_BLOCKS;
    int n = by_threads < by_smem ? by_threads : by_smem;
    return n > FAKE_SM_BLOCKS ? FAKE_SM_BLOCKS : n;
}

#endif
