/* The shared region: one file per container (CUDA_DEVICE_MEMORY_SHARED_CACHE), mapped by every
 * process of it and by HAMi's monitor. Layers above use only this interface:
 *   shm.c   open/create/size/initialise/map, the config check, exit and fork handling
 *   lock.c  the cross-process lock (flock on the file: released by the kernel if the holder dies)
 *   slots.c process slots (claim, liveness, reclaim) and per-device usage (atomics + seqlock)
 * Nothing here calls the CUDA driver: the caller (accounting/budget.c) passes device facts in
 * vgpu_region_config_t. */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdint.h>

#include "region/layout.h"
#include "vgpu.h"

#define VGPU_REGION_DEFAULT_PATH "/tmp/cudevshr.cache"

typedef struct {
    int device_count;                        /* visible devices, <= VGPU_MAX_DEVICES */
    char uuid[VGPU_MAX_DEVICES][VGPU_UUID_LEN]; /* "GPU-xxxxxxxx-..." as nvidia-smi prints */
    uint64_t limit[VGPU_MAX_DEVICES];        /* bytes from this process's env, 0 = none */
    uint64_t sm_limit[VGPU_MAX_DEVICES];     /* percent from this process's env, 0 = none */
    int priority;                            /* CUDA_TASK_PRIORITY */
} vgpu_region_config_t;

/* Fill limit/sm_limit/priority from the environment (limits parser); device facts untouched. */
VGPU_HIDDEN void vgpu_region_config_from_env(vgpu_region_config_t *cfg);
/* CUDA_DEVICE_SM_LIMIT_<dev>, else CUDA_DEVICE_SM_LIMIT: percent 1..99, 0 = none (also for >= 100) */
VGPU_HIDDEN uint64_t vgpu_env_sm_limit(int dev);

/* Open or create the region at `path` (NULL: $CUDA_DEVICE_MEMORY_SHARED_CACHE or the default),
 * initialise it once from cfg, warn where cfg disagrees with it (the region wins), claim a slot.
 * 0 on success; -1 when it cannot be used (a warning says why; callers fall back to
 * process-local accounting). Idempotent; safe from many threads. */
VGPU_HIDDEN int vgpu_region_attach(const char *path, const vgpu_region_config_t *cfg);
/* write device_num and uuids into a region created before the driver could name its devices */
VGPU_HIDDEN void vgpu_region_fill_devices(const vgpu_region_config_t *cfg);
/* the mapping, NULL when not attached */
VGPU_HIDDEN vgpu_region_t *vgpu_region_get(void);
/* this process's slot (claims a fresh one in a forked child), NULL when not attached */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_self(void);
/* free our slot and unmap (also run at exit) */
VGPU_HIDDEN void vgpu_region_detach(void);

/* Cross-process lock. 0 = held; 1 = timed out (a live holder is stuck): the caller proceeds
 * unlocked, best effort, and must still call unlock. */
VGPU_HIDDEN int vgpu_region_lock(void);
VGPU_HIDDEN void vgpu_region_unlock(void);
/* internal to region/: (re)open the lock for this process (after attach or fork) */
VGPU_HIDDEN void vgpu_region_lock_set_fd(int fd);
VGPU_HIDDEN void vgpu_region_lock_atfork_child(void);

/* --- slots (lock held unless noted) --- */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_claim_slot(vgpu_region_t *r);
VGPU_HIDDEN void vgpu_region_free_slot(vgpu_proc_slot_t *s);
/* 1 when the slot's owner is alive (pid exists, not a zombie, same start time) */
VGPU_HIDDEN int vgpu_region_slot_alive(const vgpu_proc_slot_t *s);
/* reclaim every dead process's slot; returns how many */
VGPU_HIDDEN int vgpu_region_reap(vgpu_region_t *r);
/* sum of used[dev].total over slots with status != 0 (exactly the monitor's sum; no lock needed) */
VGPU_HIDDEN uint64_t vgpu_region_sum_used(const vgpu_region_t *r, int dev);

/* --- accounting on our own slot --- */
/* 0 = counted; -1 = over the region's limit for dev; -2 = not attached (caller falls back) */
VGPU_HIDDEN int vgpu_region_reserve(int dev, uint64_t bytes);
/* lock-free: atomic subtract on our slot (saturates at 0) */
VGPU_HIDDEN void vgpu_region_release(int dev, uint64_t bytes);
VGPU_HIDDEN void vgpu_slot_add(vgpu_proc_slot_t *s, int dev, uint64_t bytes);
VGPU_HIDDEN void vgpu_slot_sub(vgpu_proc_slot_t *s, int dev, uint64_t bytes);
/* our start time in clock ticks since boot (/proc/self/stat field 22), 0 when unknown */
VGPU_HIDDEN uint64_t vgpu_proc_starttime(int pid);

#endif
