/* Process slots: claim, liveness, reclaim, finding our own slot again, and per-device usage.
 *
 * Rules (HAMi's monitor and every peer hold raw pointers into procs[]):
 * - we never move a live process's slot: no compaction; proc_num only grows (to 1024) and dead
 *   slots are reused in place. Vendor peers do compact on exit (live slots move down, proc_num
 *   shrinks): every use of our slot first checks that it still is ours (pid + the nonce of our
 *   stamp, inside proc_num) and otherwise finds it again, or claims a new one, and rewrites it
 *   from a private shadow of what we counted, so a move never loses or doubles our usage;
 * - a slot becomes visible (status != 0, or proc_num covering it) only after it is filled;
 * - a reclaimed slot gets status 0 first, so the monitor stops counting it at once;
 * - usage changes are atomic adds on our own slot, between two seqlock bumps for readers;
 * - sums saturate: a corrupt or hostile slot can make a sum large, never make it wrap small.
 * Liveness: a slot with our stamp is alive while its stamper holds its liveness byte (ident.c),
 * whatever pid namespace it lives in; any other slot (vendor, older builds of ours: their unused[]
 * words are never trusted) is judged by its pid in our namespace, as the vendor does. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"



static int clamp_procs(int n)
{
    return n < 0 ? 0 : n > VGPU_MAX_PROCS ? VGPU_MAX_PROCS : n;
}

/* slots we may claim: every one but the ledger's (the last, see vgpu_region_ledger) */
static int claimable(int n)
{
    n = clamp_procs(n);
    return n > VGPU_LEDGER_SLOT ? VGPU_LEDGER_SLOT : n;
}


/* processes (pid, start time) already seen mapping the region: a limit-bound loop of failing
 * reservations reaps again and again, and must not re-read a big process's maps every time */
#define KNOWN_USERS 32
static struct {
    int pid;
    uint64_t start;
} known[KNOWN_USERS];
static unsigned known_next;

static int known_user(int pid, uint64_t start)
{
    int i;
    for (i = 0; i < KNOWN_USERS; i++)
        if (__atomic_load_n(&known[i].pid, __ATOMIC_RELAXED) == pid &&
            __atomic_load_n(&known[i].start, __ATOMIC_RELAXED) == start)
            return 1;
    return 0;
}

static void remember_user(int pid, uint64_t start)
{
    unsigned i = __atomic_fetch_add(&known_next, 1, __ATOMIC_RELAXED) % KNOWN_USERS;
    __atomic_store_n(&known[i].start, start, __ATOMIC_RELAXED);
    __atomic_store_n(&known[i].pid, pid, __ATOMIC_RELAXED);
}

/* the region file's identity, for the maps check: set by shm.c once the file is open */
static uint64_t file_dev, file_ino;
static char file_path[4096];

VGPU_HIDDEN void vgpu_region_set_file_id(uint64_t dev, uint64_t ino, const char *path)
{
    file_dev = dev;
    file_ino = ino;
    snprintf(file_path, sizeof file_path, "%s", path);
}

/* the region file's identity (0, 0 before it is open): the same for every process of the container */
VGPU_HIDDEN void vgpu_region_file_id(uint64_t *dev, uint64_t *ino)
{
    *dev = file_dev;
    *ino = file_ino;
}

/* does a live process with this pid in our namespace use the region? 1 yes, 0 no.
 * `want_start` != 0: only a process with that start time counts. */
static int pid_user_alive(int pid, uint64_t want_start, int thorough)
{
    uint64_t start, dev, ino;
    const char *path;
    char state;

    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return 0;
    if (vgpu_proc_stat(pid, &state, &start) != 0)
        return 1; /* no /proc: trust kill() */
    if (state == 'Z' || state == 'X')
        return 0;
    if (want_start && start == want_start)
        return 1;
    if (!thorough && !want_start)
        return 1;
    /* the pid exists but may be any process: only one that maps the region is a user */
    if (known_user(pid, start))
        return 1;
    dev = file_dev;
    ino = file_ino;
    path = file_path;
    if (vgpu_proc_maps_file(pid, dev, ino, path) == 0)
        return 0;
    remember_user(pid, start);
    return 1;
}

VGPU_HIDDEN int vgpu_region_slot_alive(const vgpu_proc_slot_t *s, int thorough)
{
    const vgpu_ident_t *me = vgpu_ident_self();
    vgpu_ident_t id;
    int pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);

    if (pid <= 0)
        return 0;
    if (vgpu_stamp_read(s, &id)) {
        int live = vgpu_live_probe(vgpu_region_lock_fd(), id.nonce);
        if (live == 1)
            return 1;
        if (live < 0) /* no OFD locks: the pid can be judged only in its own namespace */
            return id.ns != me->ns ? 1 : pid != me->pid && pid_user_alive(pid, id.start, 0);
        /* the stamper has let go of its byte: alive while it is still exiting (its memory may be
         * held until it is gone) */
        if (id.ns == me->ns && pid != me->pid && vgpu_proc_still_exiting(pid, id.start))
            return 1;
        /* the stamper is gone. A vendor process may have taken the slot over since (it never
         * rewrites the stamp): only a process with that pid here that maps the region is one. */
        return pid != me->pid && pid_user_alive(pid, 0, 1) &&
               !(id.ns == me->ns && vgpu_proc_starttime(pid) == id.start);
    }
    /* vendor slot or an older build of ours: the pid in our namespace, the vendor's own rule;
     * a slot with our own pid that is not our slot was left by our previous image (exec) */
    return pid != me->pid && pid_user_alive(pid, 0, thorough);
}

static void clear_usage(vgpu_proc_slot_t *s)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        __atomic_store_n(&s->used[d].context_size, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].module_size, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].data_size, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].offset, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].total, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].unused[2], 0, __ATOMIC_RELAXED); /* a claim in flight (claim()) */
        memset(&s->device_util[d], 0, sizeof s->device_util[d]);
        s->monitorused[d] = 0;
    }
}

VGPU_HIDDEN void vgpu_region_free_slot(vgpu_proc_slot_t *s)
{
    __atomic_store_n(&s->status, VGPU_SLOT_FREE, __ATOMIC_RELEASE);
    clear_usage(s);
    vgpu_stamp_clear(s);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

/* ---- exit holds ----
 * A process that exits still holds device memory until the driver frees it, after our destructor
 * (contexts, pool reserves, what nobody freed). So our destructor does not free a slot that still
 * counts bytes: it writes them as the slot's exit hold (device_util[d].unused[0], words nobody else
 * writes) and gives the slot status 0. The monitor stops counting the process at once, as it does
 * for a vendor process's exit; our own sums go on counting the hold while the stamp is intact,
 * until a reap finds the process gone (vgpu_region_slot_alive: gone, not merely exiting). */

/* bytes held on dev by the exited owner of a free slot (0 for a live slot, or a hold whose stamp a
 * vendor process has overwritten since) */
static uint64_t exit_hold(const vgpu_proc_slot_t *s, int dev)
{
    uint64_t v = __atomic_load_n(&s->device_util[dev].unused[0], __ATOMIC_ACQUIRE);
    vgpu_ident_t id;

    return v && vgpu_stamp_read(s, &id) ? v : 0;
}

/* a free slot with a hold word set (a cheap look: no stamp check) */
static int hold_set(const vgpu_proc_slot_t *s)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++)
        if (__atomic_load_n(&s->device_util[d].unused[0], __ATOMIC_RELAXED))
            return 1;
    return 0;
}

/* an exit hold on some device (exit_hold() of any device: a word set, under an intact stamp) */
static int holds_any(const vgpu_proc_slot_t *s)
{
    vgpu_ident_t id;
    return hold_set(s) && vgpu_stamp_read(s, &id);
}

/* our slot at exit: what the shadow says we still hold becomes its exit hold */
VGPU_HIDDEN void vgpu_region_leave(vgpu_proc_slot_t *s)
{
    int d, any = 0;
    vgpu_ident_t id;

    for (d = 0; d < VGPU_MAX_DEVICES; d++)
        any |= vgpu_region_self_used(d) != 0;
    if (!any || !vgpu_stamp_read(s, &id)) { /* nothing held, or no stamp to keep a hold alive by */
        vgpu_region_free_slot(s);
        return;
    }
    for (d = 0; d < VGPU_MAX_DEVICES; d++)
        __atomic_store_n(&s->device_util[d].unused[0], vgpu_region_self_used(d), __ATOMIC_RELAXED);
    /* the hold is in place before the monitor stops counting: our sums never see neither */
    __atomic_store_n(&s->status, VGPU_SLOT_FREE, __ATOMIC_RELEASE);
}

/* lock held: a free slot's hold whose process is gone, or whose stamp no longer holds, goes */
static int reap_hold(vgpu_proc_slot_t *s, int thorough)
{
    vgpu_ident_t id;

    if (!hold_set(s) || (vgpu_stamp_read(s, &id) && vgpu_region_slot_alive(s, thorough)))
        return 0;
    vgpu_region_free_slot(s);
    return 1;
}


/* Reports (cuMemGetInfo, NVML) count exit holds too: drop those of processes now gone first, so
 * a report never shows a finished process's memory. Only free slots with a hold cost a syscall. */
VGPU_HIDDEN void vgpu_region_tidy_in(vgpu_region_t *r)
{
    int i, n, any = 0;

    n = clamp_procs(__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE));
    for (i = 0; i < n && !any; i++)
        any = __atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE && hold_set(&r->procs[i]);
    if (!any)
        return;
    if (vgpu_region_trylock() == 0)
        for (i = 0; i < n; i++)
            if (__atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE)
                reap_hold(&r->procs[i], 0);
    vgpu_region_unlock();
}

VGPU_HIDDEN int vgpu_region_reap(vgpu_region_t *r, int thorough)
{
    int i, n = clamp_procs(__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE)), freed = 0;
    const vgpu_ident_t *me = vgpu_ident_self();

    for (i = 0; i < n; i++) {
        vgpu_proc_slot_t *s = &r->procs[i];
        if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE) {
            freed += reap_hold(s, thorough);
            continue;
        }
        if (__atomic_load_n(&s->used[0].unused[1], __ATOMIC_RELAXED) == me->nonce)
            continue; /* ours */
        if (!vgpu_region_slot_alive(s, thorough)) {
            vgpu_region_free_slot(s);
            freed++;
        }
    }
    return freed;
}

static void fill_slot(vgpu_proc_slot_t *s, const vgpu_ident_t *id)
{
    clear_usage(s);
    s->hostpid = 0; /* the node side fills it for the new owner */
    vgpu_stamp_write(s, id);
    __atomic_store_n(&s->status, VGPU_SLOT_RUNNING, __ATOMIC_RELEASE);
}

/* take slot i if it is still what we saw (status 0, pid `seen`): the lock makes this
 * uncontended; the CAS keeps two claimers apart when the lock timed out */
static int take(vgpu_proc_slot_t *s, int seen, int me)
{
    return __atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE &&
           __atomic_compare_exchange_n(&s->pid, &seen, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_claim_slot(vgpu_region_t *r)
{
    const vgpu_ident_t *me = vgpu_ident_self();
    int i, n, pass;

    for (pass = 0; pass < 2; pass++) {
        n = claimable(__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE));
        /* a slot our previous image (exec: same pid, start time and namespace) left: reuse it */
        for (i = 0; i < n; i++) {
            vgpu_proc_slot_t *s = &r->procs[i];
            vgpu_ident_t id;
            if (s->pid == me->pid && s->status != VGPU_SLOT_FREE && vgpu_stamp_read(s, &id) &&
                id.ns == me->ns && id.start == me->start && id.nonce != me->nonce &&
                vgpu_live_probe(vgpu_region_lock_fd(), id.nonce) != 1) {
                vgpu_region_free_slot(s);
                if (take(s, 0, me->pid)) {
                    fill_slot(s, me);
                    return s;
                }
            }
        }
        for (i = 0; i < n; i++) {
            vgpu_proc_slot_t *s = &r->procs[i];
            int seen = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
            if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE && !holds_any(s) &&
                take(s, seen, me->pid)) {
                fill_slot(s, me);
                return s;
            }
        }
        while (n < VGPU_LEDGER_SLOT) {
            int want = n;
            /* status 0 until filled: the monitor skips it once proc_num covers it */
            if (__atomic_compare_exchange_n(&r->proc_num, &want, n + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                vgpu_proc_slot_t *s = &r->procs[n];
                __atomic_store_n(&s->status, VGPU_SLOT_FREE, __ATOMIC_RELAXED);
                __atomic_store_n(&s->pid, me->pid, __ATOMIC_RELAXED);
                fill_slot(s, me);
                return s;
            }
            n = claimable(want);
        }
        if (!vgpu_region_reap(r, 1))
            break;
    }
    return 0;
}

/* the sum of used[dev].total (and, with `claims`, of the claims in flight) over live slots, saturating.
 * A granted claim moves from the slot's pending word to its total (claim(): total first, then a release
 * on pending), so the pending word is read first (acquire): read after the move it is 0 and the total
 * read next has the claim. Read the other way round, a claim that completed between the two reads was
 * in neither, and two reservers that each missed the other that way were both granted. */
static uint64_t sum_slots(const vgpu_region_t *r, int dev, int claims)
{
    int i, n = clamp_procs(__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE));
    uint64_t sum = 0, v;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    for (i = 0; i < n; i++) {
        const vgpu_proc_slot_t *s = &r->procs[i];
        if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) != VGPU_SLOT_FREE) {
            v = claims ? __atomic_load_n(&s->used[dev].unused[2], __ATOMIC_ACQUIRE) : 0;
            sum = sum > UINT64_MAX - v ? UINT64_MAX : sum + v;
            v = __atomic_load_n(&s->used[dev].total, __ATOMIC_RELAXED);
        } else {
            v = exit_hold(s, dev);
        }
        sum = sum > UINT64_MAX - v ? UINT64_MAX : sum + v;
    }
    return sum;
}

VGPU_HIDDEN uint64_t vgpu_region_sum_used(const vgpu_region_t *r, int dev)
{
    return sum_slots(r, dev, 0);
}

VGPU_HIDDEN uint64_t vgpu_region_sum_claimed(const vgpu_region_t *r, int dev)
{
    return sum_slots(r, dev, 1);
}


/* ---- our own slot: the shadow, the checks, relocation ---- */

/* what we counted, per device: [0] data, [1] context, [2] module, [3] total */
static uint64_t shadow[VGPU_MAX_DEVICES][4];

VGPU_HIDDEN void vgpu_region_shadow_reset(void)
{
    memset(shadow, 0, sizeof shadow);
}

VGPU_HIDDEN uint64_t vgpu_region_self_used(int dev)
{
    return (dev >= 0 && dev < VGPU_MAX_DEVICES) ? __atomic_load_n(&shadow[dev][3], __ATOMIC_RELAXED) : 0;
}

VGPU_HIDDEN int vgpu_region_slot_is_self(const vgpu_region_t *r, const vgpu_proc_slot_t *s)
{
    const vgpu_ident_t *me = vgpu_ident_self();
    return __atomic_load_n(&s->used[0].unused[1], __ATOMIC_RELAXED) == me->nonce &&
           __atomic_load_n(&s->pid, __ATOMIC_RELAXED) == me->pid &&
           __atomic_load_n(&s->status, __ATOMIC_RELAXED) != VGPU_SLOT_FREE &&
           s - r->procs < __atomic_load_n(&r->proc_num, __ATOMIC_RELAXED);
}

static uint64_t *field(vgpu_proc_slot_t *s, int dev, int kind)
{
    return kind == VGPU_USE_CONTEXT ? &s->used[dev].context_size
           : kind == VGPU_USE_MODULE ? &s->used[dev].module_size
                                     : &s->used[dev].data_size;
}

static void write_shadow(vgpu_proc_slot_t *s)
{
    int d;
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        __atomic_store_n(&s->used[d].data_size, __atomic_load_n(&shadow[d][0], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].context_size, __atomic_load_n(&shadow[d][1], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].module_size, __atomic_load_n(&shadow[d][2], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&s->used[d].total, __atomic_load_n(&shadow[d][3], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    }
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_RELEASE);
}

/* lock held by the caller (shm.c). Our slot moved (a vendor peer compacted the table) or was
 * taken from us: find the slot with our pid and nonce, else claim a fresh one; either way it gets
 * exactly what the shadow says we hold. */
VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_relocate(vgpu_region_t *r, vgpu_proc_slot_t *lost)
{
    int i, n = clamp_procs(__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE));
    vgpu_proc_slot_t *s = 0;

    for (i = 0; i < n && !s; i++)
        if (vgpu_region_slot_is_self(r, &r->procs[i]))
            s = &r->procs[i];
    if (!s) {
        s = vgpu_region_claim_slot(r);
        VGPU_INFO("our region slot %ld was taken over; claimed slot %ld", lost ? (long)(lost - r->procs) : -1L,
                  s ? (long)(s - r->procs) : -1L);
    } else if (s != lost) {
        VGPU_INFO("our region slot moved from %ld to %ld (a peer compacted the table)",
                  lost ? (long)(lost - r->procs) : -1L, (long)(s - r->procs));
    }
    if (s)
        write_shadow(s);
    return s;
}

/* Several of our threads may update at once; the seqlock is only a hint for lock-free readers
 * (each counter is itself atomic), so two fetch_adds bracket every update. */
VGPU_HIDDEN void vgpu_slot_add_kind(vgpu_proc_slot_t *s, int dev, int kind, uint64_t bytes, int order)
{
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(field(s, dev, kind), bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->used[dev].total, bytes, order);
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_RELEASE);
}

/* release: a reader that sees the new value (acquire) sees what was written before it (claim()) */
VGPU_HIDDEN void vgpu_region_sub_sat(uint64_t *p, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, cur > bytes ? cur - bytes : 0, 1, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
        ;
}

VGPU_HIDDEN void vgpu_slot_sub_kind(vgpu_proc_slot_t *s, int dev, int kind, uint64_t bytes)
{
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    vgpu_region_sub_sat(field(s, dev, kind), bytes);
    vgpu_region_sub_sat(&s->used[dev].total, bytes);
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_RELEASE);
}

VGPU_HIDDEN void vgpu_shadow_add(int dev, int kind, uint64_t bytes)
{
    __atomic_fetch_add(&shadow[dev][kind], bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&shadow[dev][3], bytes, __ATOMIC_RELAXED);
}

VGPU_HIDDEN void vgpu_shadow_sub(int dev, int kind, uint64_t bytes)
{
    vgpu_region_sub_sat(&shadow[dev][kind], bytes);
    vgpu_region_sub_sat(&shadow[dev][3], bytes);
}

/* for callers outside region/ that charge our own slot directly (accounting's forced charges):
 * the shadow follows, so a relocation after a vendor compaction keeps these bytes too */
VGPU_HIDDEN void vgpu_slot_add(vgpu_proc_slot_t *s, int dev, uint64_t bytes)
{
    vgpu_shadow_add(dev, VGPU_USE_DATA, bytes);
    vgpu_slot_add_kind(s, dev, VGPU_USE_DATA, bytes, __ATOMIC_RELAXED);
}

VGPU_HIDDEN void vgpu_slot_sub(vgpu_proc_slot_t *s, int dev, uint64_t bytes)
{
    vgpu_shadow_sub(dev, VGPU_USE_DATA, bytes);
    vgpu_slot_sub_kind(s, dev, VGPU_USE_DATA, bytes);
}

