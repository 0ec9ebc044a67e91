/* What a launch's grid can hold of its device's SMs (occupancy.c), for VGPU_SM_CHARGE=occupancy: the SM
 * limit as a share of the SMs, as MPS's active thread percentage is, rather than of the GPU's time. */
#ifndef VGPU_LIMITER_OCCUPANCY_H
#define VGPU_LIMITER_OCCUPANCY_H

#include <stdint.h>

#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "vgpu.h"

#define VGPU_PPM 1000000u /* the whole device */

/* the fraction of device dev's SMs that `grid` can occupy at once, in ppm (1..VGPU_PPM): its blocks over
 * the device's SM count times the blocks of that shape one SM holds (the driver's occupancy API);
 * VGPU_PPM when it cannot be known (a graph, no grid, no such entry point, an error), so an unknown launch
 * is charged in full. `shape` names the launch; the answer is cached per shape. */
VGPU_HIDDEN unsigned vgpu_occupancy_ppm(const vgpu_limiter_ops_t *ops, int dev, uint64_t shape,
                                        const vgpu_grid_t *grid);

#endif
