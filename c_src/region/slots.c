/* Process slots: claim, liveness, reclaim, and per-device usage in our own slot.
 *
 * Rules (HAMi's monitor and every peer hold raw pointers into procs[]):
 * - a live process's slot never moves: no compaction; proc_num only grows (to 1024) and dead
 *   slots are reused in place;
 * - a slot becomes visible (status != 0, or proc_num covering it) only after it is filled;
 * - a reclaimed slot gets status 0 first, so the monitor stops counting it at once;
 * - usage changes are atomic adds on our own slot, between two seqlock bumps for readers. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "region/region.h"

/* /proc/<pid>/stat: state (field 3) and starttime (field 22). -1 when unreadable. */
static int read_stat(int pid, char *state, uint64_t *start)
{
    char path[64], buf[1024], *p;
    unsigned long long st = 0;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* comm may contain spaces and ')' */
    if (!p || p[1] != ' ')
        return -1;
    *state = p[2];
    p += 2;
    for (field = 3; field < 22 && *p; p++)
        if (*p == ' ')
            field++;
    if (field != 22 || sscanf(p, "%llu", &st) != 1)
        return -1;
    *start = st;
    return 0;
}

VGPU_HIDDEN uint64_t vgpu_proc_starttime(int pid)
{
    char state;
    uint64_t start;
    return read_stat(pid, &state, &start) == 0 ? start : 0;
}

/* the inode of our pid namespace: pids in a slot mean something only inside the same one */
static uint64_t pid_ns(void)
{
    static uint64_t ns;
    struct stat st;

    if (!ns && stat("/proc/self/ns/pid", &st) == 0)
        ns = (uint64_t)st.st_ino;
    return ns;
}

VGPU_HIDDEN int vgpu_region_slot_alive(const vgpu_proc_slot_t *s)
{
    int pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
    uint64_t want = __atomic_load_n(&s->unused[0], __ATOMIC_RELAXED);
    uint64_t ns = __atomic_load_n(&s->unused[1], __ATOMIC_RELAXED);
    uint64_t start;
    char state;

    if (pid <= 0)
        return 0;
    /* a file shared across pid namespaces (one cache mounted into two containers): we cannot
     * judge another namespace's pid, so its slot is never reclaimed by us */
    if (ns && pid_ns() && ns != pid_ns())
        return 1;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    /* kill() says a process with that pid exists; a zombie, or another process that reused the pid
     * (different start time), does not own the slot. No /proc: trust kill(). */
    if (read_stat(pid, &state, &start) != 0)
        return 1;
    if (state == 'Z' || state == 'X')
        return 0;
    return !want || want == start;
}

static void clear_usage(vgpu_proc_slot_t *s)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        memset(&s->used[d], 0, sizeof s->used[d]);
        memset(&s->device_util[d], 0, sizeof s->device_util[d]);
        s->monitorused[d] = 0;
    }
}

VGPU_HIDDEN void vgpu_region_free_slot(vgpu_proc_slot_t *s)
{
    __atomic_store_n(&s->status, VGPU_SLOT_FREE, __ATOMIC_RELEASE);
    clear_usage(s);
    __atomic_store_n(&s->unused[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

VGPU_HIDDEN int vgpu_region_reap(vgpu_region_t *r)
{
    int i, n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE), me = (int)getpid(), freed = 0;

    if (n > VGPU_MAX_PROCS)
        n = VGPU_MAX_PROCS;
    for (i = 0; i < n; i++) {
        vgpu_proc_slot_t *s = &r->procs[i];
        if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE || s->pid == me)
            continue;
        if (!vgpu_region_slot_alive(s)) {
            vgpu_region_free_slot(s);
            freed++;
        }
    }
    return freed;
}

static void fill_slot(vgpu_proc_slot_t *s, int pid, uint64_t start)
{
    clear_usage(s);
    if (s->pid != pid)
        s->hostpid = 0; /* the node side fills it for the new owner */
    s->pid = pid;
    s->unused[0] = start;
    s->unused[1] = pid_ns();
    __atomic_store_n(&s->status, VGPU_SLOT_RUNNING, __ATOMIC_RELEASE);
}

VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_claim_slot(vgpu_region_t *r)
{
    int i, n, pass, me = (int)getpid();
    uint64_t start = vgpu_proc_starttime(me);

    for (pass = 0; pass < 2; pass++) {
        n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
        if (n < 0)
            n = 0;
        if (n > VGPU_MAX_PROCS)
            n = VGPU_MAX_PROCS;
        /* a slot with our pid was left by our previous image (exec) or a dead namesake: reuse it */
        for (i = 0; i < n; i++)
            if (r->procs[i].pid == me && r->procs[i].status != VGPU_SLOT_FREE) {
                vgpu_region_free_slot(&r->procs[i]);
                fill_slot(&r->procs[i], me, start);
                return &r->procs[i];
            }
        for (i = 0; i < n; i++)
            if (__atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE) {
                fill_slot(&r->procs[i], me, start);
                return &r->procs[i];
            }
        if (n < VGPU_MAX_PROCS) {
            memset(&r->procs[n], 0, sizeof r->procs[n]);
            fill_slot(&r->procs[n], me, start);
            __atomic_store_n(&r->proc_num, n + 1, __ATOMIC_RELEASE);
            return &r->procs[n];
        }
        if (!vgpu_region_reap(r))
            break;
    }
    return 0;
}

VGPU_HIDDEN uint64_t vgpu_region_sum_used(const vgpu_region_t *r, int dev)
{
    int i, n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
    uint64_t sum = 0;

    if (n > VGPU_MAX_PROCS)
        n = VGPU_MAX_PROCS;
    for (i = 0; i < n; i++)
        if (__atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE) != VGPU_SLOT_FREE)
            sum += __atomic_load_n(&r->procs[i].used[dev].total, __ATOMIC_RELAXED);
    return sum;
}

/* Several of our threads may update at once; the seqlock is only a hint for lock-free readers
 * (each counter is itself atomic), so two fetch_adds bracket every update. */
VGPU_HIDDEN void vgpu_slot_add(vgpu_proc_slot_t *s, int dev, uint64_t bytes)
{
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&s->used[dev].data_size, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->used[dev].total, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_RELEASE);
}

static void sub_saturating(uint64_t *p, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, cur > bytes ? cur - bytes : 0, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

VGPU_HIDDEN void vgpu_slot_sub(vgpu_proc_slot_t *s, int dev, uint64_t bytes)
{
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    sub_saturating(&s->used[dev].data_size, bytes);
    sub_saturating(&s->used[dev].total, bytes);
    __atomic_fetch_add(&s->seqlock, 1, __ATOMIC_RELEASE);
}

/* Publish the claim (a seq_cst add on our own slot), full fence, then sum every live slot, our
 * claim included; over the limit: withdraw it. For any two racing reservers A and B, the later of
 * the two sums sees the other's claim (store->fence->load on both sides: they cannot both miss),
 * so two claims that do not fit together are never both kept. A race can refuse a request that
 * would have fitted (both see each other, both withdraw); it can never exceed the limit. The
 * transient claim is visible to lock-free readers (the monitor, cuMemGetInfo) for the few ns it
 * lives. */
static uint64_t claim(vgpu_proc_slot_t *self, vgpu_region_t *r, int dev, uint64_t bytes)
{
    __atomic_fetch_add(&self->seqlock, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&self->used[dev].data_size, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&self->used[dev].total, bytes, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&self->seqlock, 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return vgpu_region_sum_used(r, dev);
}

/* Fast path, no lock: claim and check. Only when that fails, under the lock: claim again (the
 * same order: the lock serialises slow paths and reaping, not fast paths, and the limit does not
 * depend on it, so a lock timeout is safe too), and when still over, reap dead peers and sum again
 * (a later sum than the first: it still sees every claim the first one had to see). */
VGPU_HIDDEN int vgpu_region_reserve(int dev, uint64_t bytes)
{
    vgpu_proc_slot_t *self = vgpu_region_self();
    vgpu_region_t *r = vgpu_region_get();
    uint64_t limit, sum;
    int ok;

    if (!self || !r)
        return -2;
    limit = __atomic_load_n(&r->limit[dev], __ATOMIC_RELAXED);
    if (!limit) { /* no limit: nothing to check against, no lock */
        vgpu_slot_add(self, dev, bytes);
        return 0;
    }
    if (bytes > limit)
        return -1;
    if (VGPU_LIKELY(claim(self, r, dev, bytes) <= limit))
        return 0;
    vgpu_slot_sub(self, dev, bytes);
    vgpu_region_lock();
    sum = claim(self, r, dev, bytes);
    if (sum > limit && vgpu_region_reap(r)) /* dead peers' usage out, then decide */
        sum = vgpu_region_sum_used(r, dev);
    ok = sum <= limit;
    if (!ok)
        vgpu_slot_sub(self, dev, bytes);
    vgpu_region_unlock();
    return ok ? 0 : -1;
}

VGPU_HIDDEN void vgpu_region_release(int dev, uint64_t bytes)
{
    vgpu_proc_slot_t *self = vgpu_region_self();
    if (self)
        vgpu_slot_sub(self, dev, bytes);
}
