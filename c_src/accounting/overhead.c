/* The physical overhead of this process on each limited device (see overhead.h).
 *
 * Truth: NVML's per-process used memory (what the host's nvidia-smi shows for the process). It
 * names host pids, and inside a container our getpid() is a namespaced one, so our entry is found
 * by a probe: a small allocation (charged) made between two listings; the one entry that grew by
 * its size is ours. A pid alone is not evidence: a neighbour may start during our context creation,
 * NVML may list us late, a neighbour's host pid may equal our namespaced pid. The entry is probed
 * again when the evidence changes (it vanishes, or shows less than we hold). While it is unknown,
 * the device-wide used-memory delta around each context creation stands in.
 *
 * Outside any pid namespace (ours is the initial one) there is nothing to find: NVML's host pids
 * are our pids, one process each, so the entry under getpid() is ours. There the probe's first
 * listing (the measurement's own when it shows us) settles it: no probe allocation, no two more
 * listings. Inside a namespace the three listings stay: before the probe (who grows anyway), while
 * it is held (who grew), after its release (who fell back); with any two, a neighbour growing or
 * freeing at the wrong moment is taken for us while NVML lists us late. The delta's figure after a
 * context is read only when its measurement did not find our entry (before it must be read anyway:
 * whether it will is not known yet). A first context costs 2 NVML queries outside a namespace, 4 in
 * one (5 when the probe finds nothing); a later one 1.
 *
 * This is the measuring floor: it reads what is held and sets the overhead's charge to it. What may
 * be taken (the pre-charges of contexts and streams, refusals) is precharge.c's, above it; nothing
 * here calls back up.
 *
 * overhead(dev) = NVML(our pid, dev) - (what we charge on dev other than the overhead itself),
 * never negative; the difference to the last value is forced into the budget (the memory is
 * already taken). Measured at every context creation, before an allocation that comes near the
 * limit (rate-limited), on every refusal, and once before the first report. Devices without a
 * limit are never measured: no NVML is loaded for them. */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nvml.h>

#include "accounting/budget.h"
#include "accounting/device.h"
#include "accounting/overhead.h"
#include "accounting/pool.h"
#include "driver/real.h"
#include "log/log.h"

#define MiB (1024.0 * 1024.0)
#define NEAR_LIMIT_INTERVAL_NS 20000000ull /* 20 ms between measurements near the limit */
#define MAX_PROCS 256
#define PROBE_BYTES (2u << 20)              /* the allocation granularity of current GPUs */
#define PROBE_INTERVAL_NS 100000000ull     /* 100 ms between probes that found nothing */
#define SLACK (64ull << 20)                 /* NVML showing this much less than we hold is not news */
#define PAUSE_LISTING_NS 1000000ull         /* listings slower than this are made without pausing charges */
/* A listing this young is the figure: a refusal, a report and the limiter's census use it rather than
 * list again (NVML may take 200 ms a call). As young as measurements near the limit are apart, so a
 * figure is never older than the 20 ms the reports promise. */
#define FRESH_NS 20000000ull


/* A device's state, split by who may touch it. */
struct dev_seen { /* read and written without the lock (atomics): what other threads look at */
    int measured;        /* at least once */
    uint64_t last_ns;    /* last measurement */
    int no_list;         /* the last listing failed: the fallback is all there is */
    nvmlDevice_t nvml;   /* NULL until looked up */
    uint64_t ctx_cost;   /* what this process's last context creation took, measured (0: none yet) */
    uint64_t standin;    /* charged for contexts and streams being made, until measured: not an allocation */
    uint64_t room;       /* charged for the identity probe while our entry is unknown (set under the lock) */
    uint64_t fresh_ns;   /* when the last measurement ended */
    uint64_t charge_ns;  /* fresh_ns of the last one made for a charge (near the limit, or refusing) */
    int procs;           /* how many processes the last listing showed (-1: it failed) */
    uint64_t procs_ns;   /* when it ended (0: no listing yet) */
};
struct dev_books { /* the measurement's own books, under lock */
    pthread_mutex_t lock;
    uint64_t charged;    /* what we count for the overhead now */
    uint64_t fallback;   /* sum of used-memory deltas of our context creations */
    uint64_t gap;        /* what our confirmed entry was seen to show less than we hold */
    uint64_t cover;      /* during a measurement: stand-ins the overhead's growth takes first */
    int probing;         /* a probe from the room is held: the room is in our entry */
    uint64_t listing_ns; /* how long the last process listing took */
};

static struct dev_seen seen[VGPU_MAX_DEVICES];
static struct dev_books books[VGPU_MAX_DEVICES];

static unsigned host_pid; /* 0 = unknown */
static uint64_t last_probe_ns;
static int init_pidns = -1; /* in the initial pid namespace: 1 yes, 0 no or cannot tell, -1 not looked yet */
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ok;

typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
static procs_fn list_fn;

__attribute__((constructor)) static void init_locks(void)
{
    int i;

    for (i = 0; i < VGPU_MAX_DEVICES; i++)
        pthread_mutex_init(&books[i].lock, NULL);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nvml_start(void)
{
    void *v3;
    nvmlReturn_t rc = NVML_ERROR_UNINITIALIZED;

    if (vgpu_lib_init(VGPU_LIB_NVML) == 0) {
        vgpu_nvml_inner++; /* our session, not the application's (interpose/nvml_init.c) */
        rc = REAL(nvmlInit_v2)();
        vgpu_nvml_inner--;
    }
    if (rc != NVML_SUCCESS) {
        VGPU_WARN("NVML is not usable in this process: the memory CUDA contexts take is not counted against the "
                  "limit; make libnvidia-ml.so.1 visible to the container");
        return;
    }
    /* _v3 is newer than the vendor's surface (not a slot of ours); same record layout as _v2 */
    v3 = vgpu_resolve("nvmlDeviceGetComputeRunningProcesses_v3", VGPU_LIB_NVML, 0);
    list_fn = v3 ? (procs_fn)v3 : (procs_fn)vgpu_real_fn(VGPU_IDX_nvmlDeviceGetComputeRunningProcesses_v2);
    nvml_ok = 1;
}

static nvmlDevice_t nvml_of(int dev)
{
    char uuid[96];
    nvmlDevice_t h = NULL;

    pthread_once(&nvml_once, nvml_start);
    if (!nvml_ok)
        return NULL;
    h = __atomic_load_n(&seen[dev].nvml, __ATOMIC_ACQUIRE);
    if (h)
        return h;
    /* by UUID: NVML's index is not the container's CUDA ordinal once devices are reordered */
    if (vgpu_dev_uuid(dev, uuid, sizeof uuid) != 0 || REAL(nvmlDeviceGetHandleByUUID)(uuid, &h) != NVML_SUCCESS)
        return NULL;
    __atomic_store_n(&seen[dev].nvml, h, __ATOMIC_RELEASE); /* racing threads store the same handle */
    return h;
}

/* the device's compute processes; count, or -1 when NVML cannot tell. Every listing is made with the
 * device's lock held, so there is never more than one in flight per device; its count serves the
 * limiter's census (vgpu_overhead_gpu_procs) while it is fresh. */
static int list_procs(int dev, nvmlDevice_t h, nvmlProcessInfo_t *out)
{
    unsigned n = MAX_PROCS;
    int count = -1;

    if (list_fn && list_fn(h, &n, out) == NVML_SUCCESS)
        count = (int)(n > MAX_PROCS ? MAX_PROCS : n);
    __atomic_store_n(&seen[dev].procs, count, __ATOMIC_RELAXED);
    __atomic_store_n(&seen[dev].procs_ns, now_ns(), __ATOMIC_RELEASE);
    return count;
}

static int device_used(nvmlDevice_t h, unsigned long long *used)
{
    nvmlMemory_t m;

    if (REAL(nvmlDeviceGetMemoryInfo)(h, &m) != NVML_SUCCESS || m.used > m.total) /* garbage: no figure */
        return -1;
    *used = m.used;
    return 0;
}

/* Growth of the overhead is forced into the budget (the driver holds it already), but first taken
 * from the stand-ins charged for it (cover): forced beside them, the two together would put the
 * region's sum over the limit for a moment. */
static void set_charge(int dev, uint64_t overhead)
{
    struct dev_books *s = &books[dev];
    uint64_t grow = overhead > s->charged ? overhead - s->charged : 0, taken = grow < s->cover ? grow : s->cover;

    if (taken) { /* a stand-in's bytes become the overhead's: charges() sees no change */
        s->cover -= taken;
        __atomic_fetch_sub(&seen[dev].standin, taken, __ATOMIC_SEQ_CST);
    }
    if (grow)
        vgpu_budget_force(dev, grow - taken);
    else if (overhead < s->charged)
        vgpu_budget_release(dev, s->charged - overhead);
    if (!seen[dev].measured || (overhead > s->charged ? overhead - s->charged : s->charged - overhead) >= (64u << 20))
        VGPU_INFO("device %d: the driver holds %.0f MiB for this process beyond its allocations; counted against "
                  "the limit",
                  dev, overhead / MiB);
    s->charged = overhead;
    __atomic_store_n(&seen[dev].measured, 1, __ATOMIC_RELAXED);
}

/* the device's size (asked once), 0 when the driver cannot say */
static uint64_t device_bytes(int dev)
{
    static uint64_t total[VGPU_MAX_DEVICES];
    uint64_t t = __atomic_load_n(&total[dev], __ATOMIC_RELAXED);
    CUdevice d;
    size_t sz;

    if (!t && REAL(cuDeviceGet)(&d, dev) == CUDA_SUCCESS && REAL(cuDeviceTotalMem_v2)(&sz, d) == CUDA_SUCCESS)
        __atomic_store_n(&total[dev], (t = sz), __ATOMIC_RELAXED);
    return t;
}

/* An NVML figure above the device's size is garbage (one was seen at 2^53 B): believed, it would be
 * forced into the region and make every peer judge the region corrupt. */
static int sane(int dev, unsigned long long bytes, unsigned pid)
{
    static int warned;
    uint64_t t = device_bytes(dev);

    if (!t)
        return bytes < (1ull << 50); /* 1 PiB: no device is near it */
    if (bytes <= t)
        return 1;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        VGPU_WARN("device %d: NVML reports %llu bytes used by host pid %u, more than the device's %llu: not "
                  "believed", dev, bytes, pid, (unsigned long long)t);
    return 0;
}

static int known(int dev, const nvmlProcessInfo_t *p)
{
    return p->usedGpuMemory != (unsigned long long)NVML_VALUE_NOT_AVAILABLE && sane(dev, p->usedGpuMemory, p->pid);
}

static unsigned long long used_of(const nvmlProcessInfo_t *procs, int n, unsigned pid)
{
    int i;

    for (i = 0; i < n; i++)
        if (procs[i].pid == pid && procs[i].usedGpuMemory != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
            return procs[i].usedGpuMemory;
    return 0;
}

/* one process listing of a device and our charges (the overhead's aside) sampled around it */
struct listing {
    nvmlProcessInfo_t procs[MAX_PROCS];
    int n;
    uint64_t before, after; /* our charges (overhead aside) just before and after the listing */
    uint64_t low;           /* the least of them the driver surely held: without charges ahead of calls */
};

/* our entry's index in the listing, n when absent */
static int entry_of(const struct listing *l, unsigned pid)
{
    int i;

    for (i = 0; i < l->n && l->procs[i].pid != pid; i++)
        ;
    return i;
}

/* our charges for allocations (not the overhead, nor stand-ins for contexts being made), and the part
 * of them the driver may hold or not: ahead of driver calls still running, or managed memory that
 * NVML shows only once touched */
static uint64_t charges(int dev, uint64_t *ahead)
{
    uint64_t standin = __atomic_load_n(&seen[dev].standin, __ATOMIC_SEQ_CST), v;

    if (!books[dev].probing) /* the room is not held either, but by a probe */
        standin += __atomic_load_n(&seen[dev].room, __ATOMIC_RELAXED);
    *ahead = vgpu_budget_in_flight(dev) + vgpu_budget_unshown_now(dev); /* maybe held, maybe not */
    v = vgpu_budget_mine(dev) - books[dev].charged;
    return v > standin ? v - standin : 0;
}

/* NVML is fast enough to pause our charges around its listings (accounting/budget.c): a slow one
 * would hold every allocating thread up */
static int may_pause(int dev)
{
    return books[dev].listing_ns < PAUSE_LISTING_NS;
}

/* With our charges paused around the listing (pause; else the caller paused them), none in flight,
 * the two samples agree and are all held, and the reading is exact. */
static void list_into(int dev, nvmlDevice_t h, struct listing *l, int pause)
{
    uint64_t ahead, t0, trimmed;

    if (pause)
        vgpu_budget_pause(dev);
    l->before = charges(dev, &ahead);
    l->low = l->before > ahead ? l->before - ahead : 0;
    t0 = now_ns();
    l->n = list_procs(dev, h, l->procs);
    books[dev].listing_ns = now_ns() - t0;
    l->after = charges(dev, &ahead);
    if (pause)
        vgpu_budget_resume(dev);
    ahead = l->after > ahead ? l->after - ahead : 0;
    if (ahead < l->low)
        l->low = ahead;
    /* a pool trimmed meanwhile (a synchronize, cuMemPoolTrimTo from another thread) was charged for
     * memory the listing may not have counted: not surely held */
    trimmed = vgpu_pool_settle_dev(dev);
    l->low = l->low > trimmed ? l->low - trimmed : 0;
}

/* A device's lock held, our charges paused by the caller when NVML is fast, the probe charged, l
 * holding the listing made before it: the pid of the one entry that grew by a probe allocation
 * while it was held and fell back by it once it was released, 0 if not exactly one: a neighbour
 * allocating all the time grows at every listing, and was taken for us. Our own charges are paused
 * throughout (a free of ours must not hide the probe's growth). The probe is made with the real
 * cuMemCreate, which needs no current context. The listing made while it is held serves the
 * measurement that follows (the probe is in both our charges and our entry): identifying costs two
 * listings more. */
static unsigned probe_once(int dev, nvmlDevice_t h, CUdevice d, struct listing *l)
{
    nvmlProcessInfo_t other[MAX_PROCS]; /* before the probe, then after it */
    const nvmlProcessInfo_t *during = l->procs;
    CUmemGenericAllocationHandle mem;
    CUmemAllocationProp prop;
    unsigned grew[4], found = 0;
    int nb = l->n, na = -1, nd = -1, i, j, ngrew = 0, hits = 0;

    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d;
    if (nb < 0)
        return 0;
    memcpy(other, l->procs, sizeof *other * (size_t)nb);
    if (REAL(cuMemCreate)(&mem, PROBE_BYTES, &prop, 0) == CUDA_SUCCESS) {
        list_into(dev, h, l, 0);
        nd = l->n;
        for (i = 0; i < nd; i++)
            if (known(dev, &during[i]) && during[i].usedGpuMemory >= used_of(other, nb, during[i].pid) + PROBE_BYTES)
                grew[ngrew++ & 3] = during[i].pid;
        REAL(cuMemRelease)(mem);
        if (ngrew && ngrew <= 4) /* more: too busy a device to tell */
            na = list_procs(dev, h, other);
    }
    for (j = 0; j < ngrew && na >= 0; j++) /* na < 0 unless 1..4 grew */
        if (used_of(during, nd, grew[j]) >= used_of(other, na, grew[j]) + PROBE_BYTES) {
            found = grew[j];
            hits++;
        }
    return hits == 1 ? found : 0;
}

/* whether this process is in the initial pid namespace (whose proc inode is fixed, 0xEFFFFFFC):
 * then the pids NVML names are ours. Without /proc (or before Linux 3.8) we cannot tell: the probe. */
static int in_init_pidns(void)
{
    int v = __atomic_load_n(&init_pidns, __ATOMIC_RELAXED);
    char link[64];
    ssize_t n;

    if (v >= 0)
        return v;
    n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n > 0)
        link[n] = 0;
    v = n > 0 && strcmp(link, "pid:[4026531836]") == 0;
    __atomic_store_n(&init_pidns, v, __ATOMIC_RELAXED);
    return v;
}

/* our entry in a listing without a probe: outside a pid namespace, the one under getpid() (pids are
 * unique there, and NVML's are the same pids); inside one a pid is no evidence (0) */
static unsigned listed_as_self(int dev, const struct listing *l)
{
    unsigned me = (unsigned)getpid();
    int i;

    if (l->n < 0 || !in_init_pidns())
        return 0;
    i = entry_of(l, me);
    return i < l->n && known(dev, &l->procs[i]) ? me : 0;
}

/* lock held: the probe's room goes back (our entry found, or NVML cannot tell it: no list, no
 * per-process figures) */
static void drop_room(int dev)
{
    uint64_t room = __atomic_exchange_n(&seen[dev].room, 0, __ATOMIC_RELAXED);

    if (room)
        vgpu_budget_release(dev, room);
}


/* A device's lock held: find our entry. A first listing (our charges paused with it when NVML is
 * fast) shows it under our own pid outside a pid namespace (listed_as_self, where `by_pid`: not when
 * the entry so found contradicted what we hold: then only the probe's evidence counts); else a probe
 * allocation, charged first: from the room kept for it while our entry is unknown (a full container
 * has none to spare, and an unknown entry leaves our contexts counted by a guess), else reserved
 * for the moment under `limit` (no room: no probe). 1 when found, else 0; either way l holds the
 * last listing made, which serves the measurement (while our entry is unknown only its failing or
 * not is judged). */
static int probe_identity(int dev, nvmlDevice_t h, struct listing *l, uint64_t limit, int by_pid)
{
    uint64_t room = __atomic_load_n(&seen[dev].room, __ATOMIC_RELAXED);
    int own_room = room >= PROBE_BYTES, pause = may_pause(dev);
    unsigned found;
    CUdevice d;

    __atomic_store_n(&last_probe_ns, now_ns(), __ATOMIC_RELAXED);
    if (pause)
        vgpu_budget_pause(dev);
    list_into(dev, h, l, 0); /* before any probe: the room in our charges is not in our entry */
    found = by_pid ? listed_as_self(dev, l) : 0;
    if (!found && l->n >= 0 && REAL(cuDeviceGet)(&d, dev) == CUDA_SUCCESS &&
        (own_room || vgpu_budget_reserve(dev, PROBE_BYTES, limit) == 0)) {
        books[dev].probing = own_room;
        found = probe_once(dev, h, d, l);
        books[dev].probing = 0;
        if (!own_room)
            vgpu_budget_release(dev, PROBE_BYTES);
    }
    if (pause)
        vgpu_budget_resume(dev);
    if (!found)
        return 0;
    drop_room(dev); /* found: the room is not needed any more */
    if (__atomic_exchange_n(&host_pid, found, __ATOMIC_RELAXED) != found)
        VGPU_INFO("NVML knows this process as host pid %u", found);
    return 1;
}


/* rate-limited unless forced: probing costs two listings. 1 when it made a listing into l */
static int identify(int dev, nvmlDevice_t h, int force, struct listing *l, uint64_t limit)
{
    if (!force && now_ns() - __atomic_load_n(&last_probe_ns, __ATOMIC_RELAXED) < PROBE_INTERVAL_NS)
        return 0;
    probe_identity(dev, h, l, limit, 1);
    return 1;
}


/* Without NVML's process list (an error, a pid namespace it cannot see into) our contexts would
 * go uncounted: the device-wide used-memory delta of our context creations stands in. It may hold
 * a neighbour's memory too, which only makes the limit stricter. */
static void no_list_warning(int dev)
{
    static int warned;

    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        VGPU_WARN("device %d: NVML cannot list the processes using it: the memory of this process's CUDA contexts "
                  "is taken from the device's used-memory change around each context creation, which may count "
                  "other processes' memory too",
                  dev);
}

/* lock held: our own figure is not to be had; what a driver call may just have added stays charged
 * at its stand-in, as a context at its delta */
static int use_fallback(int dev, uint64_t extra)
{
    books[dev].fallback += extra;
    set_charge(dev, books[dev].fallback);
    return 0;
}

/* ---- one measurement: list, judge the listing, charge what it shows ---- */

/* a measurement of one device, lock held */
struct reading {
    int dev;
    uint64_t limit; /* in force, passed down by the caller (a probe is charged under it) */
    uint64_t extra; /* what a driver call just made may have added (a stream's piece), held unless ruled out */
    nvmlDevice_t h;
    int listed;     /* l holds a listing a probe made, not judged yet */
    int retried;    /* our entry was probed again once already */
    struct listing l;
};

#define LIST_AGAIN (-1)

/* The evidence changed: the entry shows less than we surely hold (or is gone while we hold memory):
 * it is not ours, or no longer. Probed again (at most every PROBE_INTERVAL_NS), judged by what that
 * finds; 1 when it probed (the caller judges a new listing). */
static int recheck_identity(struct reading *r, unsigned pid, uint64_t held, uint64_t ours)
{
    struct dev_books *b = &books[r->dev];

    if (held <= ours + SLACK + b->gap || r->retried ||
        now_ns() - __atomic_load_n(&last_probe_ns, __ATOMIC_RELAXED) < PROBE_INTERVAL_NS)
        return 0;
    r->retried = 1;
    VGPU_INFO("device %d: NVML's entry for host pid %u shows %.0f MiB, less than this process holds: "
              "finding its entry again", r->dev, pid, ours / MiB);
    r->listed = 1; /* the probe's last listing is judged next */
    if (probe_identity(r->dev, r->h, &r->l, r->limit, 0)) {
        /* the same entry again: what it does not show (managed memory not yet touched) is accepted
         * until the gap grows further */
        b->gap = __atomic_load_n(&host_pid, __ATOMIC_RELAXED) == pid ? held - ours : 0;
    } else {
        __atomic_store_n(&host_pid, 0, __ATOMIC_RELAXED);
        if (b->charged > b->fallback) /* the last figure we trusted stands in */
            b->fallback = b->charged;
    }
    return 1;
}

/* The overhead is what NVML shows beyond our charges, and the charges are not all held at the moment
 * NVML reads: an allocation or free racing with the reading shows between our two samples, and
 * charges taken ahead of driver calls still running may be held yet or not. So the reading only
 * bounds it: at least ours less the larger sample (every charge held: no phantom overhead from a
 * race), at most ours less the charges surely held. Charged below the bound, it rises to it; above
 * the other, it falls to it; in between it stays: a reading while 32 MiB pool steps are being
 * charged ahead must not lower it by them, to be found short when they land. The pause around the
 * listing makes the two bounds one, unless a driver call outlasted it. */
static uint64_t bounded_overhead(const struct reading *r, uint64_t ours)
{
    uint64_t least = r->l.before > r->l.after ? r->l.before : r->l.after, most, now;

    least = ours > least ? ours - least : 0;
    most = ours > r->l.low ? ours - r->l.low : 0;
    now = books[r->dev].charged + r->extra;
    return now > least ? (now < most ? now : most) : least;
}

/* 1 when the figure is this process's own (NVML per process), 0 for the fallback, LIST_AGAIN when
 * our entry was probed again and a new listing is to be judged */
static int judge_listing(struct reading *r)
{
    const struct listing *l = &r->l;
    unsigned pid;
    uint64_t ours, held;
    int i;

    __atomic_store_n(&seen[r->dev].no_list, l->n < 0, __ATOMIC_RELAXED);
    if (l->n < 0) {
        drop_room(r->dev);
        no_list_warning(r->dev);
        return use_fallback(r->dev, r->extra);
    }
    if (!(pid = __atomic_load_n(&host_pid, __ATOMIC_RELAXED)))
        return use_fallback(r->dev, r->extra);
    i = entry_of(l, pid);
    if (i < l->n && !known(r->dev, &l->procs[i])) {
        drop_room(r->dev);
        return use_fallback(r->dev, r->extra); /* MIG or a vGPU host hides per-process figures */
    }
    ours = i < l->n ? l->procs[i].usedGpuMemory : 0;
    held = l->before < l->after ? l->before : l->after;
    if (recheck_identity(r, pid, held, ours))
        return LIST_AGAIN;
    if (i == l->n) {
        set_charge(r->dev, 0); /* no context of ours on this device (any more) */
        return 1;
    }
    drop_room(r->dev); /* our entry is known (found on another device meanwhile): no probe needs the room */
    set_charge(r->dev, bounded_overhead(r, ours));
    return 1;
}

/* lock held; 1 when the figure is this process's own, 0 for the fallback */
static int measure(int dev, int force_probe, uint64_t extra, uint64_t limit)
{
    struct reading r;
    int own;

    r.dev = dev;
    r.limit = limit;
    r.extra = extra;
    r.listed = r.retried = 0;
    r.h = nvml_of(dev);
    __atomic_store_n(&seen[dev].last_ns, now_ns(), __ATOMIC_RELAXED);
    if (!r.h)
        return 0;
    /* pools trimmed since their last allocation (a synchronize trims to the release threshold) are
     * charged for memory no longer held: settled first, or the reading would take them for held */
    vgpu_pool_settle_dev(dev);
    if (!__atomic_load_n(&host_pid, __ATOMIC_RELAXED))
        r.listed = identify(dev, r.h, force_probe, &r.l, limit);
    do {
        if (!r.listed)
            list_into(dev, r.h, &r.l, may_pause(dev));
        r.listed = 0;
    } while ((own = judge_listing(&r)) == LIST_AGAIN);
    __atomic_store_n(&seen[dev].fresh_ns, now_ns(), __ATOMIC_RELAXED);
    return own;
}

/* lock held: measure with stand-ins (*standin) the growth takes first; what it did not take is left
 * in *standin for the caller to give back */
static int measure_covering(int dev, int force_probe, uint64_t extra, uint64_t limit, uint64_t *standin)
{
    int own;

    books[dev].cover = *standin;
    own = measure(dev, force_probe, extra, limit);
    *standin = books[dev].cover;
    books[dev].cover = 0;
    return own;
}

static int fresh(uint64_t at_ns)
{
    return at_ns && now_ns() - at_ns < FRESH_NS;
}

/* A refusal (forced, for a charge) waits for the device's measurement in flight and uses its figure (it
 * ended after the refusal asked: never a second listing beside it); it also uses the figure of the last
 * charge's measurement within FRESH_NS while nothing was measured since (a burst of refusals pays one
 * listing, not one each); else it measures, so what was freed behind our back (a context destroyed) is
 * seen. Our own events that change what the driver holds (a context made or destroyed, a stream made)
 * measure anew, never from these. */
VGPU_HIDDEN int vgpu_overhead_refresh(int dev, int how, uint64_t limit)
{
    struct dev_books *b;
    uint64_t asked = now_ns(), done, charged;
    int force = how & VGPU_REFRESH_FORCE;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || !limit)
        return 0;
    b = &books[dev];
    /* near the limit: at most every 20 ms from the start of the last measurement, and never within
     * FRESH_NS of its end (a listing slower than 20 ms would otherwise be followed by the next at once) */
    if (!force && (now_ns() - __atomic_load_n(&seen[dev].last_ns, __ATOMIC_RELAXED) < NEAR_LIMIT_INTERVAL_NS ||
                   fresh(__atomic_load_n(&seen[dev].fresh_ns, __ATOMIC_RELAXED))))
        return 0;
    if (force)
        pthread_mutex_lock(&b->lock);
    else if (pthread_mutex_trylock(&b->lock) != 0)
        return 0; /* another thread is measuring right now */
    done = __atomic_load_n(&seen[dev].fresh_ns, __ATOMIC_RELAXED);
    charged = __atomic_load_n(&seen[dev].charge_ns, __ATOMIC_RELAXED);
    if (!(how & VGPU_REFRESH_CHARGE) || !force || (done < asked && !(charged == done && fresh(done)))) {
        measure(dev, 0, 0, limit);
        if (how & VGPU_REFRESH_CHARGE)
            __atomic_store_n(&seen[dev].charge_ns, __atomic_load_n(&seen[dev].fresh_ns, __ATOMIC_RELAXED),
                             __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&b->lock);
    return 1;
}

VGPU_HIDDEN void vgpu_overhead_ensure(int dev)
{
    if (dev < 0 || dev >= VGPU_MAX_DEVICES)
        return;
    if (!__atomic_load_n(&seen[dev].measured, __ATOMIC_RELAXED))
        vgpu_overhead_refresh(dev, VGPU_REFRESH_FORCE, vgpu_budget_limit_peek(dev));
    else if (!__atomic_load_n(&host_pid, __ATOMIC_RELAXED))
        vgpu_overhead_refresh(dev, 0, vgpu_budget_limit_peek(dev)); /* still estimated: NVML may list us by now */
}

/* ---- what the pre-charges (precharge.c) ask of the measurement ---- */

VGPU_HIDDEN uint64_t vgpu_overhead_ctx_estimate(int dev)
{
    uint64_t est = __atomic_load_n(&seen[dev].ctx_cost, __ATOMIC_RELAXED);

    return est ? est : vgpu_budget_ctx_hint(dev, device_bytes(dev));
}

VGPU_HIDDEN uint64_t vgpu_overhead_room_wanted(int dev)
{
    nvmlDevice_t h = nvml_of(dev);

    if (!h || __atomic_load_n(&seen[dev].no_list, __ATOMIC_RELAXED) || __atomic_load_n(&host_pid, __ATOMIC_RELAXED))
        return 0;
    return __atomic_load_n(&seen[dev].room, __ATOMIC_RELAXED) ? 0 : PROBE_BYTES;
}

VGPU_HIDDEN void vgpu_overhead_keep_room(int dev, uint64_t room)
{
    pthread_mutex_lock(&books[dev].lock);
    if (__atomic_load_n(&seen[dev].room, __ATOMIC_RELAXED) || __atomic_load_n(&host_pid, __ATOMIC_RELAXED))
        vgpu_budget_release(dev, room); /* another thread's, or found meanwhile */
    else
        __atomic_store_n(&seen[dev].room, room, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&books[dev].lock);
}

VGPU_HIDDEN void vgpu_overhead_standin(int dev, uint64_t bytes, int add)
{
    if (add)
        __atomic_fetch_add(&seen[dev].standin, bytes, __ATOMIC_SEQ_CST);
    else
        __atomic_fetch_sub(&seen[dev].standin, bytes, __ATOMIC_SEQ_CST);
}

VGPU_HIDDEN void vgpu_overhead_snapshot(struct vgpu_ctx_probe *p)
{
    nvmlDevice_t h = nvml_of(p->dev);

    if (!h)
        return;
    /* the device-wide delta stands in only while our entry is unknown: two NVML calls saved */
    p->delta = !__atomic_load_n(&host_pid, __ATOMIC_RELAXED);
    if (p->delta && device_used(h, &p->used_before) != 0)
        return;
    p->armed = 1;
}

VGPU_HIDDEN int vgpu_overhead_measure_ctx(struct vgpu_ctx_probe *p, uint64_t limit, uint64_t *took)
{
    struct dev_books *b = &books[p->dev];
    unsigned long long used_after = 0;
    nvmlDevice_t h = nvml_of(p->dev);
    uint64_t prev;
    int own, judge;

    pthread_mutex_lock(&b->lock);
    prev = b->charged;
    b->cover = p->precharge;
    own = measure(p->dev, 1, 0, limit);
    /* while our entry is unknown still: the device's used-memory change, or if more, what such a
     * context took (a neighbour's pool trimmed meanwhile makes the change look smaller by its
     * steps), charged as the fallback, the stand-in still covering it. Read after the measurement,
     * not before it: once it found our entry (outside a pid namespace, its first listing does) the
     * delta is never used, and its second figure is not asked for. */
    if (h && p->delta && !__atomic_load_n(&host_pid, __ATOMIC_RELAXED) && device_used(h, &used_after) == 0) {
        p->added = used_after > p->used_before ? used_after - p->used_before : 0;
        if (p->added < p->precharge)
            p->added = p->precharge;
        use_fallback(p->dev, p->added);
    }
    p->precharge = b->cover;
    b->cover = 0;
    prev = b->charged > prev ? b->charged - prev : 0; /* what the new context added */
    judge = own || seen[p->dev].no_list;
    if (own && prev) { /* what the next context will be charged ahead */
        if (!seen[p->dev].ctx_cost)
            vgpu_budget_set_ctx_hint(p->dev, prev);
        __atomic_store_n(&seen[p->dev].ctx_cost, prev, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&b->lock);
    *took = prev;
    return judge;
}

VGPU_HIDDEN void vgpu_overhead_forget_ctx(struct vgpu_ctx_probe *p, uint64_t limit)
{
    struct dev_books *b = &books[p->dev];

    if (!limit)
        return;
    pthread_mutex_lock(&b->lock); /* the destroyed context's delta is no longer held */
    b->fallback -= p->added < b->fallback ? p->added : b->fallback;
    measure(p->dev, 0, 0, limit); /* what it held is gone: measured anew, never from a fresh figure */
    pthread_mutex_unlock(&b->lock);
}

VGPU_HIDDEN void vgpu_overhead_measure_growth(struct vgpu_growth *g, uint64_t limit)
{
    pthread_mutex_lock(&books[g->dev].lock);
    measure_covering(g->dev, 0, g->standin, limit, &g->standin);
    pthread_mutex_unlock(&books[g->dev].lock);
}

/* The limiter's census, on the launch path: a fresh count is used as it is; while another thread lists
 * (a measurement holds the lock) the last count stands in rather than a second listing; only with no
 * count at all does a launch wait for that listing. */
VGPU_HIDDEN int vgpu_overhead_gpu_procs(int dev)
{
    nvmlProcessInfo_t procs[MAX_PROCS];
    struct dev_books *b;
    nvmlDevice_t h;
    uint64_t at;
    int n;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || !(h = nvml_of(dev)))
        return -1;
    b = &books[dev];
    at = __atomic_load_n(&seen[dev].procs_ns, __ATOMIC_ACQUIRE);
    if (fresh(at))
        return __atomic_load_n(&seen[dev].procs, __ATOMIC_RELAXED);
    if (pthread_mutex_trylock(&b->lock) != 0) {
        if (at)
            return __atomic_load_n(&seen[dev].procs, __ATOMIC_RELAXED);
        pthread_mutex_lock(&b->lock);
    }
    if (fresh(__atomic_load_n(&seen[dev].procs_ns, __ATOMIC_ACQUIRE))) /* listed while we waited */
        n = __atomic_load_n(&seen[dev].procs, __ATOMIC_RELAXED);
    else
        n = list_procs(dev, h, procs);
    pthread_mutex_unlock(&b->lock);
    return n;
}

/* for the limiter's check of a high-priority claim, which asks at most every 100 ms while it yields */
VGPU_HIDDEN int vgpu_overhead_gpu_util(int dev)
{
    nvmlUtilization_t u;
    nvmlDevice_t h;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || !(h = nvml_of(dev)) ||
        REAL(nvmlDeviceGetUtilizationRates)(h, &u) != NVML_SUCCESS || u.gpu > 100) /* garbage: no figure */
        return -1;
    return (int)u.gpu;
}

VGPU_HIDDEN unsigned vgpu_overhead_host_pid(void)
{
    return __atomic_load_n(&host_pid, __ATOMIC_RELAXED);
}

VGPU_HIDDEN void vgpu_overhead_atfork_child(void)
{
    int i;

    host_pid = 0;
    last_probe_ns = 0;
    init_pidns = -1; /* a child of unshare(CLONE_NEWPID) is in another pid namespace */
    for (i = 0; i < VGPU_MAX_DEVICES; i++) {
        nvmlDevice_t h = seen[i].nvml;
        uint64_t listing_ns = books[i].listing_ns;

        memset(&seen[i], 0, sizeof seen[i]); /* the child's contexts and budget are its own to measure */
        memset(&books[i], 0, sizeof books[i]);
        seen[i].nvml = h;
        books[i].listing_ns = listing_ns;
        pthread_mutex_init(&books[i].lock, NULL);
    }
}
