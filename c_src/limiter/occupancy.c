/* === OCCUPANCY: how much of a device's SMs a launch's grid can hold, for VGPU_SM_CHARGE=occupancy.
 *
 * Without MPS the GPU runs one context at a time, and a kernel that fills a quarter of the SMs holds
 * the GPU as long as one that fills them all: the default charge (time, HAMi's meaning) counts both in
 * full. With occupancy a launch is charged its time times the fraction of the SMs its grid can occupy,
 * so an SM limit of 50 lets a decode step of a quarter of the SMs run at full speed, as MPS at 50 % does.
 *
 * The fraction is blocks / (SMs x the blocks of this function, block size and dynamic shared memory
 * one SM holds: cuOccupancyMaxActiveBlocksPerMultiprocessor), at most 1. It is asked once per launch
 * shape and device (the limiter's shape word already names the function and its dimensions) and kept
 * in a direct-mapped table of one word per entry, so a reader never sees half an update; a collision
 * only asks the driver again. Whatever cannot be known is charged in full. */
#include <limits.h>

#include "limiter/occupancy.h"

#define SLOTS 256 /* shapes remembered per device */
#define PPM_BITS 20 /* VGPU_PPM < 2^20 */
#define PPM_MASK ((1ull << PPM_BITS) - 1)

static uint64_t cache[VGPU_MAX_DEVICES][SLOTS]; /* (shape's top bits << PPM_BITS) | ppm; 0 empty */
static int sm_count[VGPU_MAX_DEVICES];          /* 0 not asked yet, -1 unknown */

static unsigned ask(const vgpu_limiter_ops_t *ops, int dev, const vgpu_grid_t *grid)
{
    int per_sm = 0, sms = __atomic_load_n(&sm_count[dev], __ATOMIC_RELAXED);
    unsigned long long capacity, ppm;

    if (!sms) {
        sms = ops->sm_count ? ops->sm_count(dev) : -1;
        __atomic_store_n(&sm_count[dev], sms > 0 ? sms : -1, __ATOMIC_RELAXED);
    }
    if (sms <= 0 || !ops->occupancy || !grid->threads || grid->threads > INT_MAX ||
        ops->occupancy(&per_sm, grid->f, (int)grid->threads, grid->smem) != CUDA_SUCCESS || per_sm <= 0)
        return VGPU_PPM;
    capacity = (unsigned long long)per_sm * (unsigned long long)sms;
    if (grid->blocks >= capacity)
        return VGPU_PPM;
    ppm = (grid->blocks * VGPU_PPM + capacity - 1) / capacity; /* rounded up: never charged less than held */
    return ppm ? (unsigned)ppm : 1;
}

VGPU_HIDDEN unsigned vgpu_occupancy_ppm(const vgpu_limiter_ops_t *ops, int dev, uint64_t shape,
                                        const vgpu_grid_t *grid)
{
    uint64_t *slot, word, tag = shape >> PPM_BITS;
    unsigned ppm;

    if (!grid || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return VGPU_PPM;
    slot = &cache[dev][(shape ^ (shape >> 29)) % SLOTS];
    word = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (word && word >> PPM_BITS == tag)
        return (unsigned)(word & PPM_MASK);
    ppm = ask(ops, dev, grid);
    __atomic_store_n(slot, tag << PPM_BITS | ppm, __ATOMIC_RELAXED);
    return ppm;
}
