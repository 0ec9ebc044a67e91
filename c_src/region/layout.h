/* HAMi shared region, layout version 1.2 (byte-compatible with HAMi's Go monitor).
 *
 * The monitor maps this file without locks, checks initialized_flag and major_version, sums
 * procs[0..proc_num).used[d].total over slots with status != 0, and writes recent_kernel and
 * utilization_switch. Every offset below is pinned: a change here breaks live nodes.
 * tests/region/test_layout.py compares these offsets with vgpu_patch/region.py's table.
 */
#ifndef VGPU_REGION_LAYOUT_H
#define VGPU_REGION_LAYOUT_H

#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>

#include "vgpu.h" /* VGPU_MAX_DEVICES (16, fixed by the layout) */

#define VGPU_REGION_MAGIC 19920718
#define VGPU_REGION_MAJOR 1u
#define VGPU_REGION_MINOR 2u
#define VGPU_MAX_PROCS 1024
#define VGPU_UUID_LEN 96

_Static_assert(VGPU_MAX_DEVICES == 16, "layout 1.2 has 16 device entries");

/* slot status values the monitor understands */
#define VGPU_SLOT_FREE 0
#define VGPU_SLOT_RUNNING 1
#define VGPU_SLOT_SUSPENDED 2

typedef struct {
    uint64_t context_size;
    uint64_t module_size;
    uint64_t data_size;
    uint64_t offset;
    uint64_t total; /* what the monitor and our budget sum */
    uint64_t unused[3]; /* used[0].unused[0..1]: our stamp's check word and nonce (see the slot);
                         * used[d].unused[2]: bytes this process is claiming on d right now */
} vgpu_device_memory_t;

typedef struct {
    uint64_t dec_util;
    uint64_t enc_util;
    uint64_t sm_util;
    uint64_t unused[3];
} vgpu_device_util_t;

typedef struct {
    int32_t pid;     /* pid in the container's namespace */
    int32_t hostpid; /* filled by the node side; we never overwrite a non-zero value */
    vgpu_device_memory_t used[VGPU_MAX_DEVICES];
    uint64_t monitorused[VGPU_MAX_DEVICES];
    vgpu_device_util_t device_util[VGPU_MAX_DEVICES];
    int32_t status;
    uint64_t seqlock; /* odd while the owner updates used[] */
    /* Ours, in words the monitor ignores and vendor writers never write (so a slot a vendor process
     * took over keeps whatever was there): unused[0] the owner's /proc start time (clock ticks),
     * unused[1] the inode of its pid namespace. With used[0].unused[0] (a check word over pid, both
     * of these and the nonce) and used[0].unused[1] (the owner's random nonce, which names its
     * liveness lock byte) they form the stamp of region/ident.c; none is trusted without the check. */
    uint64_t unused[2];
} vgpu_proc_slot_t;

typedef struct {
    int32_t initialized_flag; /* VGPU_REGION_MAGIC, written last by the creator */
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    sem_t sem; /* initialised for vendor peers; we lock with an OFD lock on the file instead */
    uint64_t device_num;
    char uuids[VGPU_MAX_DEVICES][VGPU_UUID_LEN];
    uint64_t limit[VGPU_MAX_DEVICES];    /* bytes, 0 = no limit */
    uint64_t sm_limit[VGPU_MAX_DEVICES]; /* percent, 0 or >= 100 = no limit */
    vgpu_proc_slot_t procs[VGPU_MAX_PROCS];
    int32_t proc_num; /* we only grow it and reuse slots in place; vendor writers shrink it (compaction) */
    int32_t utilization_switch;
    int32_t recent_kernel;
    int32_t priority;
    uint64_t last_kernel_time;
    sem_t sem_postinit;
} vgpu_region_t;

/* The container's compute ledger (limiter/bucket.c: one SM budget per device for every process
 * of the container) lives in words nobody else reads: the last process slot's used[] entries.
 * Our writers never claim that slot, and its status stays 0, so HAMi's monitor (which sums only
 * live slots) and the vendor's writers (which take it only as the 1024th process) pass it by.
 * Each entry carries a check word: a ledger found without it (zeroed, or a vendor process's
 * usage) is started afresh, never trusted. */
#define VGPU_LEDGER_SLOT (VGPU_MAX_PROCS - 1)
typedef struct {
    uint64_t check;     /* VGPU_LEDGER_CHECK ^ device: the words below are ours */
    uint64_t tokens;    /* int64: GPU ns the container may still use (negative: debt) */
    uint64_t refill_ns; /* int64, CLOCK_MONOTONIC: when the tokens were last topped up */
    uint64_t spare[5];  /* [3], [4]: a context-cost hint and its check word (hints.c) */
} vgpu_ledger_t;
#define VGPU_LEDGER_CHECK 0x7667707573686172ull /* "vgpushar" */
_Static_assert(sizeof(vgpu_ledger_t) == sizeof(vgpu_device_memory_t), "a ledger entry fills one used[] entry");

#define VGPU_LAYOUT_AT(type, field, off) \
    _Static_assert(offsetof(type, field) == (off), #type "." #field " must be at " #off)

_Static_assert(sizeof(sem_t) == 32, "glibc sem_t is 32 bytes on x86-64 and aarch64");

VGPU_LAYOUT_AT(vgpu_device_memory_t, context_size, 0);
VGPU_LAYOUT_AT(vgpu_device_memory_t, module_size, 8);
VGPU_LAYOUT_AT(vgpu_device_memory_t, data_size, 16);
VGPU_LAYOUT_AT(vgpu_device_memory_t, offset, 24);
VGPU_LAYOUT_AT(vgpu_device_memory_t, total, 32);
VGPU_LAYOUT_AT(vgpu_device_memory_t, unused, 40);
_Static_assert(sizeof(vgpu_device_memory_t) == 64, "device_memory_t is 64 bytes");

VGPU_LAYOUT_AT(vgpu_device_util_t, dec_util, 0);
VGPU_LAYOUT_AT(vgpu_device_util_t, enc_util, 8);
VGPU_LAYOUT_AT(vgpu_device_util_t, sm_util, 16);
VGPU_LAYOUT_AT(vgpu_device_util_t, unused, 24);
_Static_assert(sizeof(vgpu_device_util_t) == 48, "device_util_t is 48 bytes");

VGPU_LAYOUT_AT(vgpu_proc_slot_t, pid, 0);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, hostpid, 4);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, used, 8);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, monitorused, 1032);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, device_util, 1160);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, status, 1928);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, seqlock, 1936);
VGPU_LAYOUT_AT(vgpu_proc_slot_t, unused, 1944);
_Static_assert(sizeof(vgpu_proc_slot_t) == 1960, "process slot is 1960 bytes");

VGPU_LAYOUT_AT(vgpu_region_t, initialized_flag, 0);
VGPU_LAYOUT_AT(vgpu_region_t, major_version, 4);
VGPU_LAYOUT_AT(vgpu_region_t, minor_version, 8);
VGPU_LAYOUT_AT(vgpu_region_t, sm_init_flag, 12);
VGPU_LAYOUT_AT(vgpu_region_t, owner_pid, 16);
VGPU_LAYOUT_AT(vgpu_region_t, sem, 24);
VGPU_LAYOUT_AT(vgpu_region_t, device_num, 56);
VGPU_LAYOUT_AT(vgpu_region_t, uuids, 64);
VGPU_LAYOUT_AT(vgpu_region_t, limit, 1600);
VGPU_LAYOUT_AT(vgpu_region_t, sm_limit, 1728);
VGPU_LAYOUT_AT(vgpu_region_t, procs, 1856);
VGPU_LAYOUT_AT(vgpu_region_t, proc_num, 2008896);
VGPU_LAYOUT_AT(vgpu_region_t, utilization_switch, 2008900);
VGPU_LAYOUT_AT(vgpu_region_t, recent_kernel, 2008904);
VGPU_LAYOUT_AT(vgpu_region_t, priority, 2008908);
VGPU_LAYOUT_AT(vgpu_region_t, last_kernel_time, 2008912);
VGPU_LAYOUT_AT(vgpu_region_t, sem_postinit, 2008920);
_Static_assert(sizeof(vgpu_region_t) == 2008952, "region is 2,008,952 bytes");

#endif
