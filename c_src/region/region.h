/* The shared region: one file per container (CUDA_DEVICE_MEMORY_SHARED_CACHE), mapped by every
 * process of it and by HAMi's monitor. Layers above use only this interface:
 *   shm.c   open/create/allocate/initialise/map, trust checks, the config check, exit and fork
 *   find.c  the region beside the library, for a process started with a scrubbed environment
 *   heir.c  a file that replaces a deleted one inherits the live processes still using that one
 *   lock.c  the cross-process lock (an OFD lock on the file: dropped by the kernel if the holder
 *           dies, never inherited by a fork child, not takeable through a read-only descriptor)
 *   ident.c process identity across pid namespaces: the slot stamp, the liveness lock, /proc
 *   trust.c whether a file (kind, owner, names) and its process table may be trusted at all
 *   slots.c process slots (claim, liveness, reclaim, finding our own slot again after a vendor
 *           peer compacted the table) and per-device sums (atomics + seqlock + a private shadow)
 *   usage.c our own slot's charges against a limit the caller passes in; the ledger; tidying
 * Calls go one way: usage -> shm -> find, heir -> slots -> ident, lock, trust (find and heir use
 * trust and ident too). region/ stores and sums; the limit in force is limits/' rule, read once
 * by accounting/budget.c and passed down.
 * Nothing here calls the CUDA driver: the caller (accounting/budget.c) passes device facts in
 * vgpu_region_config_t. */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stddef.h>
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
/* why a region file with these facts, in a directory with facts `dir` (NULL: unknown), is not to be
 * trusted (shm.c refuses it with a warning, find.c passes it over), 0 when it may be: a regular file
 * with one name, writable by its owner, owned by our euid or root, or by another uid of the container
 * (any owner in a directory that is not sticky: the container's own; shm.c says why) */
enum { VGPU_DISTRUST_TYPE = 1, VGPU_DISTRUST_OWNER, VGPU_DISTRUST_LINKS, VGPU_DISTRUST_READONLY };
struct stat;
VGPU_HIDDEN int vgpu_region_distrust(const struct stat *st, const struct stat *dir);
/* which file is the region when the caller names none (find.c): $CUDA_DEVICE_MEMORY_SHARED_CACHE;
 * with neither it nor any limit variable set, the one region beside this library; else the default */
VGPU_HIDDEN void vgpu_region_choose_path(char *out, size_t n);
/* write device_num and uuids into a region created before the driver could name its devices */
VGPU_HIDDEN void vgpu_region_fill_devices(const vgpu_region_config_t *cfg);
/* a file being initialised (lock held, magic not yet written) takes over the live slots of the
 * deleted file it replaces, found through its processes' descriptors (heir.c) */
VGPU_HIDDEN void vgpu_region_inherit(vgpu_region_t *r, int fd, const char *path);
/* the mapping, NULL when not attached */
VGPU_HIDDEN vgpu_region_t *vgpu_region_get(void);
/* this process's slot (claims a fresh one in a forked child), NULL when not attached */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_self(void);
/* free our slot and unmap (also run at exit) */
VGPU_HIDDEN void vgpu_region_detach(void);
/* 1 once vgpu_region_detach ran with a region attached: the process is exiting, and what its threads
 * still ask for is refused (no slot counts it any more; a per-process budget would let it past) */
VGPU_HIDDEN int vgpu_region_left(void);

/* Cross-process lock. 0 = held; 1 = timed out (a live holder is stuck): the caller proceeds
 * unlocked, best effort, and must still call unlock. */
VGPU_HIDDEN int vgpu_region_lock(void);
VGPU_HIDDEN int vgpu_region_trylock(void);
VGPU_HIDDEN void vgpu_region_unlock(void);
/* internal to region/: the descriptor the lock (and our liveness byte) live on */
VGPU_HIDDEN void vgpu_region_lock_set_fd(int fd);
VGPU_HIDDEN int vgpu_region_lock_fd(void);
VGPU_HIDDEN void vgpu_region_lock_atfork_child(void);

/* --- identity (ident.c) --- */
typedef struct {
    int pid;        /* in our pid namespace */
    uint64_t start; /* /proc start time, clock ticks since boot */
    uint64_t ns;    /* inode of the pid namespace */
    uint64_t nonce; /* random per process image; names the liveness byte */
} vgpu_ident_t;
VGPU_HIDDEN const vgpu_ident_t *vgpu_ident_self(void);
VGPU_HIDDEN void vgpu_ident_reset(void); /* fork child: a new identity on next use */
VGPU_HIDDEN uint64_t vgpu_pid_ns(void);
VGPU_HIDDEN void vgpu_stamp_write(vgpu_proc_slot_t *s, const vgpu_ident_t *id);
VGPU_HIDDEN void vgpu_stamp_clear(vgpu_proc_slot_t *s);
/* 1 when the slot carries a stamp of ours that matches its pid (*out filled either way) */
VGPU_HIDDEN int vgpu_stamp_read(const vgpu_proc_slot_t *s, vgpu_ident_t *out);
/* take our liveness byte (0), or -1 (no OFD locks: liveness falls back to pid + start time) */
VGPU_HIDDEN int vgpu_live_hold(int fd, uint64_t nonce);
/* 1 the stamper with this nonce is alive, 0 it is gone, -1 cannot tell */
VGPU_HIDDEN int vgpu_live_probe(int fd, uint64_t nonce);
/* 1 the process maps the file, 0 it does not, -1 cannot tell */
VGPU_HIDDEN int vgpu_proc_maps_file(int pid, uint64_t dev, uint64_t ino, const char *path);
/* the region file's identity, for the maps check (shm.c tells slots.c once the file is open) */
VGPU_HIDDEN void vgpu_region_set_file_id(uint64_t dev, uint64_t ino, const char *path);
VGPU_HIDDEN void vgpu_region_file_id(uint64_t *dev, uint64_t *ino);

/* --- slots (lock held unless noted) --- */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_claim_slot(vgpu_region_t *r);
VGPU_HIDDEN void vgpu_region_free_slot(vgpu_proc_slot_t *s);
/* our slot at exit (lock held): freed, or, while we still hold bytes, left as an exit hold: status 0
 * for the monitor, still counted by our sums until a reap finds us gone */
VGPU_HIDDEN void vgpu_region_leave(vgpu_proc_slot_t *s);
/* 1 when the slot's owner is alive: our stamp and its liveness byte, else the pid in our
 * namespace (exists, not a zombie, and, when `thorough`, maps the region) */
VGPU_HIDDEN int vgpu_region_slot_alive(const vgpu_proc_slot_t *s, int thorough);
/* reclaim every dead process's slot; returns how many */
VGPU_HIDDEN int vgpu_region_reap(vgpu_region_t *r, int thorough);
/* exit holds of processes now gone, dropped (no wait for the lock; cheap when there are none) */
VGPU_HIDDEN void vgpu_region_tidy(void);
/* exit holds of processes now gone, in r, dropped (usage.c's vgpu_region_tidy on the attached one) */
VGPU_HIDDEN void vgpu_region_tidy_in(vgpu_region_t *r);
/* sum of used[dev].total over slots with status != 0 (the monitor's sum), plus the exit holds of
 * free slots (saturating at 2^64-1) */
VGPU_HIDDEN uint64_t vgpu_region_sum_used(const vgpu_region_t *r, int dev);
/* the same plus the claims in flight (used[dev].unused[2]): what a reservation must fit beside */
VGPU_HIDDEN uint64_t vgpu_region_sum_claimed(const vgpu_region_t *r, int dev);
/* NULL when the process table is sane, else what is wrong with it (shm.c refuses such a file) */
VGPU_HIDDEN const char *vgpu_region_table_insane(const vgpu_region_t *r);
/* the region's stored memory limit word for dev, raw (0: none, or not attached); the limit in force
 * is limits/' rule over it and the env (vgpu_limit_in_force), applied by accounting/budget.c */
VGPU_HIDDEN uint64_t vgpu_region_stored_limit(int dev);
/* the region's stored SM percent word for dev, raw (0: none or not attached; the vendor's 100 is
 * none too); the percent in force is limits/' rule over it and the env, applied by limiter/limiter.c */
VGPU_HIDDEN uint64_t vgpu_region_stored_sm_limit(int dev);

/* the container's compute ledger entry for dev (layout.h), NULL when not attached; the limiter
 * owns what the words mean */
VGPU_HIDDEN vgpu_ledger_t *vgpu_region_ledger(int dev);
/* what the last first CUDA context a process of the container created on dev took (hints.c); 0 when
 * unknown, or larger than device_bytes (0: no bound) */
VGPU_HIDDEN uint64_t vgpu_region_ctx_hint(int dev, uint64_t device_bytes);
VGPU_HIDDEN void vgpu_region_set_ctx_hint(int dev, uint64_t bytes);

/* --- accounting on our own slot --- */
/* which used[dev] field a charge lands in (always in total too) */
enum { VGPU_USE_DATA = 0, VGPU_USE_CONTEXT = 1, VGPU_USE_MODULE = 2 };
/* against `limit` (the limit in force, 0 = none): 0 = counted; -1 = over it; -2 = not attached
 * (caller falls back) */
VGPU_HIDDEN int vgpu_region_reserve(int dev, uint64_t bytes, uint64_t limit);
VGPU_HIDDEN int vgpu_region_reserve_kind(int dev, uint64_t bytes, int kind, uint64_t limit);
/* lock-free: atomic subtract on our slot (saturates at 0) */
VGPU_HIDDEN void vgpu_region_release(int dev, uint64_t bytes);
VGPU_HIDDEN void vgpu_region_release_kind(int dev, uint64_t bytes, int kind);
/* add / subtract on our own slot (s = vgpu_region_self()) without a limit check; our shadow follows */
VGPU_HIDDEN void vgpu_slot_add(vgpu_proc_slot_t *s, int dev, uint64_t bytes);
VGPU_HIDDEN void vgpu_slot_sub(vgpu_proc_slot_t *s, int dev, uint64_t bytes);
/* internal to region/ (slots.c): our slot's counters and their private shadow */
VGPU_HIDDEN void vgpu_slot_add_kind(vgpu_proc_slot_t *s, int dev, int kind, uint64_t bytes, int order);
VGPU_HIDDEN void vgpu_slot_sub_kind(vgpu_proc_slot_t *s, int dev, int kind, uint64_t bytes);
VGPU_HIDDEN void vgpu_shadow_add(int dev, int kind, uint64_t bytes);
VGPU_HIDDEN void vgpu_shadow_sub(int dev, int kind, uint64_t bytes);
/* *p -= bytes, stopping at 0 (release order: a reader that sees it sees what came before) */
VGPU_HIDDEN void vgpu_region_sub_sat(uint64_t *p, uint64_t bytes);
/* what this process has counted on dev (its private shadow of its slot's total) */
VGPU_HIDDEN uint64_t vgpu_region_self_used(int dev);
/* internal to region/: our slot is gone or moved: find it again or claim a new one, rewrite it
 * from the shadow (slots.c); and forget the shadow in a fork child */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_relocate(vgpu_region_t *r, vgpu_proc_slot_t *lost);
VGPU_HIDDEN void vgpu_region_shadow_reset(void);
/* 1 when s still is this process's slot in r (cheap: a few loads) */
VGPU_HIDDEN int vgpu_region_slot_is_self(const vgpu_region_t *r, const vgpu_proc_slot_t *s);

/* /proc (ident.c). A process's start time in clock ticks since boot (/proc/<pid>/stat field 22;
 * pid 0 = self), 0 when unknown */
VGPU_HIDDEN uint64_t vgpu_proc_starttime(int pid);
/* its state letter and start time; -1 when unreadable */
VGPU_HIDDEN int vgpu_proc_stat(int pid, char *state, uint64_t *start);
/* 1 while the process (pid, start time) in our namespace is still exiting (its memory may be held) */
VGPU_HIDDEN int vgpu_proc_still_exiting(int pid, uint64_t want_start);
/* usage above this many bytes is garbage (4 PiB: more than any device) */
#define VGPU_SANE_BYTES (1ull << 52)

#endif
