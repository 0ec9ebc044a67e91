/* The node-wide GPU activity board (board.c): which other contexts are busy on a device, now and
 * lately. */
#ifndef VGPU_LIMITER_BOARD_H
#define VGPU_LIMITER_BOARD_H

#include <stdint.h>

#include "vgpu.h"

/* a tag's top bit: the container is of priority 0 (CUDA_TASK_PRIORITY, HAMi's "high") */
#define VGPU_BOARD_HIGH 0x80000000u

/* Join device dev's board (key: the device's UUID, which names the file; tag: our container, the same
 * for every process of it, VGPU_BOARD_HIGH set for a high-priority one; procs: the GPU's own count of processes with a context on dev, us included,
 * -1 unknown, which tells a board filled by a forger from a full one); 0 when joined (on a full board:
 * reading only, until an entry frees up), -1 when there is no usable board. The first call opens it;
 * later calls are two loads. */
VGPU_HIDDEN int vgpu_board_join(int dev, const char *key, uint32_t tag, int (*procs)(int dev));
/* 0 not tried yet, 1 joined, -1 unusable */
VGPU_HIDDEN int vgpu_board_state(int dev);
/* we launched on dev: busy for the next little while (a store at most once a millisecond) */
VGPU_HIDDEN void vgpu_board_mark(int dev);
/* we expect our queued work on dev to be done at `until` (CLOCK_MONOTONIC ns): busy until then */
VGPU_HIDDEN void vgpu_board_until(int dev, int64_t until);
/* a thread of ours waits for the GPU (work is queued): busy until the matching release */
VGPU_HIDDEN void vgpu_board_hold(int dev);
VGPU_HIDDEN void vgpu_board_release(int dev);
/* look at the board now: the others' busy time since the last look goes into this process's history */
VGPU_HIDDEN void vgpu_board_sample(int dev);
/* how many other processes were busy on dev at the last look (0 without a board) */
VGPU_HIDDEN int vgpu_board_others(int dev);
/* ... of them, how many wrote another container's tag (junk counts as another's) */
VGPU_HIDDEN int vgpu_board_foreign(int dev);
/* ... of them, how many belong to high-priority containers (their tag has VGPU_BOARD_HIGH) */
VGPU_HIDDEN int vgpu_board_high(int dev);
/* how long other processes were busy on dev within [t0, t1] (CLOCK_MONOTONIC ns), summed over them,
 * by this process's looks (0 without a board; -1 when t0 is before its first look) */
VGPU_HIDDEN int64_t vgpu_board_busy(int dev, int64_t t0, int64_t t1);

#endif
