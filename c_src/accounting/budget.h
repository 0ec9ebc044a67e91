/* The measuring floor's books: what is counted on each device, on HAMi's shared region
 * (cross-process) or process-local when it cannot be had. The limit in force is read here
 * (vgpu_budget_limit: limits/' rule over the region's word and the env) and passed back down by the
 * charging floor, once per charge.
 * dev must already be bounds-checked by the caller (0 <= dev < VGPU_MAX_DEVICES). */
#ifndef VGPU_BUDGET_H
#define VGPU_BUDGET_H

#include <stdint.h>

#include "vgpu.h"

/* 0 when `bytes` fit under `limit` (the limit in force on dev, read once by the caller through
 * vgpu_budget_limit; 0 = none) and are now counted, -1 when over it */
VGPU_HIDDEN int vgpu_budget_reserve(int dev, uint64_t bytes, uint64_t limit);
VGPU_HIDDEN void vgpu_budget_release(int dev, uint64_t bytes);
/* count bytes that are already in use whatever the limit says (memory the driver took for us) */
VGPU_HIDDEN void vgpu_budget_force(int dev, uint64_t bytes);
/* what this process has counted on dev (all of its charges; the container-wide sum is _used) */
VGPU_HIDDEN uint64_t vgpu_budget_mine(int dev);
/* the part of those charges the driver may or may not hold now, around driver calls still running
 * (accounting/overhead.c reads the two as bounds): charges taken ahead of allocations that have not
 * returned, charges of frees the driver may have done already, a pool's spare while an allocation
 * from it runs (another thread may trim it). _ahead before the call, _landed once the call returned
 * and its charge was settled (or the charge refused) */
VGPU_HIDDEN void vgpu_budget_ahead(int dev, uint64_t bytes);
VGPU_HIDDEN void vgpu_budget_landed(int dev, uint64_t bytes);
VGPU_HIDDEN uint64_t vgpu_budget_in_flight(int dev);
/* charges NVML's per-process figure may not show (managed memory is resident only once touched):
 * `add` 1 when allocated, 0 when freed. A reading takes them as maybe held, never as surely held:
 * taken for held, they made the overhead look smaller by them, and it was short once they were
 * freed (the H200 soak with managed allocations beside pools went 52 MiB over 3 GiB) */
VGPU_HIDDEN void vgpu_budget_unshown(int dev, uint64_t bytes, int add);
VGPU_HIDDEN uint64_t vgpu_budget_unshown_now(int dev);
/* a reading about to compare our charges with what the driver holds: new charges ahead wait (a
 * bounded while) and the ones in flight land; 1 when none but the caller's own is in flight.
 * Always followed by _resume, whatever it returned. */
VGPU_HIDDEN int vgpu_budget_pause(int dev);
VGPU_HIDDEN void vgpu_budget_resume(int dev);
/* a forked child starts with nothing counted of its own */
VGPU_HIDDEN void vgpu_budget_atfork_child(void);
/* the container-wide sum, for reports and judgements: exit holds of processes gone are dropped first */
VGPU_HIDDEN uint64_t vgpu_budget_used(int dev);
/* the same as it stands, for a look on the allocation path (a reservation's slow path reaps anyway) */
VGPU_HIDDEN uint64_t vgpu_budget_sum(int dev);
/* bytes, 0 = no limit */
VGPU_HIDDEN uint64_t vgpu_budget_limit(int dev);
/* the same without attaching the region (a process that never allocates never creates one) */
VGPU_HIDDEN uint64_t vgpu_budget_limit_peek(int dev);
/* what the container's last new process's first context on dev took (region/hints.c); 0 when
 * unknown, without a region, or larger than device_bytes */
VGPU_HIDDEN uint64_t vgpu_budget_ctx_hint(int dev, uint64_t device_bytes);
VGPU_HIDDEN void vgpu_budget_set_ctx_hint(int dev, uint64_t bytes);

#endif
