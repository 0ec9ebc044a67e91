/* === LIMITER: the SM (compute) limiter, CUDA_DEVICE_SM_LIMIT[_<i>] percent of GPU time for the
 * whole container, and the monitor's launch signals.
 *
 * Every kernel, cooperative, Ex and graph launch passes through vgpu_limiter_before_launch(). No
 * thread. Every process that launches marks itself busy on the node's activity board (board.c:
 * without a limit for a while after each launch, with one until its queued work should be done);
 * with a region it does the monitor's part (below, no driver call); with an SM limit it throttles:
 *
 * 1. Measure, by sampling. One launch in SAMPLE (one in SAMPLE_SHARED while other contexts are
 *    busy on the GPU, and every launch until the first measurement) is bracketed by two events
 *    on its stream; their elapsed GPU time E is how long that launch held the stream.
 * 2. Charge our own share of E. Without MPS the GPU time-slices between contexts: a kernel longer
 *    than a slice is stretched by every other busy context (on an H200, E = 2.18 ms alone, 4.63 ms
 *    beside one busy context, 6.90 ms beside two), while short ones take turns between slices and
 *    are not (29 us alone or not). With k = 1 + how many other processes were busy on the board,
 *    on average, while the launch ran (at most MAX_K, and at most 1 + the other processes NVML lists
 *    on the device, 2 when it lists only us: no file a neighbour writes raises that; at least 1 + the
 *    share of the GPU's time NVML's utilisation shows busy beyond what we were charged, at most 2: no file
 *    lowers that, busy_floor), a measured launch of
 *    some kernel (function and launch shape) or graph is charged
 *        E                       alone (exact, as before);
 *        E / k                   when E / k >= STRETCH_NS (long: stretched), or, once it has been
 *        max(min(E, A), E/(k+1)) measured alone (A: its least E then), its own time A: the GPU's switching
 *                                between contexts is charged to nobody, and a neighbour's mark that
 *                                outlived its work does not make an unstretched launch cheap;
 *        max(E / k, min(E, L))   otherwise, L being its least E seen: a short launch beside busy
 *                                neighbours, which take turns with it, is charged E.
 *    It is never below E / k, whatever the board says. When it ran: a reference event, recorded
 *    now and then before a measured launch, maps the GPU's event times to our clock (each measured
 *    launch's start event cannot complete before the moment it was recorded, so the latest such
 *    bound is the mapping); its end event's time, less E, is when it began. Each harvest first looks
 *    at the board, and this process keeps the others' busy time from its own looks (board.c), so a
 *    neighbour's burst between two looks counts however late the harvest. A launch from before our
 *    first look is not taken for one run alone (A is learnt only from launches the history covers),
 *    nor is a launch harvested while the board shows anyone busy: a neighbour that a forger's rewrites
 *    hide now and then would otherwise leave a stretched E as A, and every later launch charged in full
 *    (a late 50 got 0.27 beside a forger rewriting the board every millisecond). Without a
 *    mapping (yet), the interval is from its launch (or E before a harvest last found it still
 *    running) to its harvest.
 *    Unmeasured launches are charged a running estimate of one launch's charge: their kernel shape's own
 *    (a lock-free table by shape; a shape not in it yet is measured while the ring has room, else charged
 *    the estimate over every kernel) or, for graphs, the graphs', with no driver call at all; alone on the GPU a measured one is charged it too when it is
 *    made, and the difference to its measured charge at its harvest, so its step pays as the others do.
 *    With VGPU_SM_CHARGE=occupancy every charge of a kernel launch, measured or estimated, is then
 *    scaled by the share of the device's SMs its grid can occupy (occupancy.c; graphs in full): the
 *    limit becomes a share of the SMs, as MPS's thread percentage is (docs/compatibility.md says which
 *    meaning suits which workload). The estimate itself stays unscaled, so launches of several shapes
 *    are each scaled by their own grid.
 * 2b. Charge the turn to us. A GPU shared without MPS turns from one context to another at a cost
 *    (about 130 us on an H200) in which nobody's work runs, and a loop of short kernels that syncs
 *    every few launches gets one turn per batch: two such loops get 0.32 of one alone each, where
 *    two of long kernels get 0.46. Charged to nobody, that cost fell on the unthrottled side: a 30
 *    beside a 70 took its whole 0.30 and left the 70 0.33. So a batch (the launches from one that
 *    finds our queue drained to the wait that drains it again) that fits in one time slice and met
 *    another container busy is charged the time it waited for the GPU beyond its kernels' own time,
 *    at most the turn's cost as this process has seen it (the second least of its last WAITS such
 *    waits: the least wait is one turn, the rest is the other's work). Processes of one container
 *    are not charged their turns to each other (the board's tag): their limit is shared anyway.
 * 3. Budget. One token bucket per container and device (bucket.c, in the region: every process of
 *    the container draws from it) fills at pct% of wall time, capped at BURST_NS while the container
 *    works. A process that finds its queue drained and the bucket unrefilled for HOLD_NS (the container
 *    idle, or just started) caps it lower, at what running flat out for HOLD_NS takes beyond its share: the limit takes hold within HOLD_NS of
 *    the work's start (a full bucket let a loop at SM 50 run unthrottled for 40 ms; the cap was 20 ms of
 *    GPU time whatever the share).
 * 4. Throttle. In debt, the launching thread sleeps until the bucket is back at zero (give or take
 *    a twentieth, so that a container's processes do not wake in lockstep), holding its process's
 *    launch lock so that its other launching threads wait too. The ring of RING event pairs bounds
 *    how far the CPU may run ahead of the GPU while measuring.
 * Driver calls per throttled launch, on average, alone: (SAMPLE-1)/SAMPLE launches make none (one
 * cuCtxGetDevice when the process sees more than one device); a sampled one makes
 * cuStreamIsCapturing, cuCtxGetCurrent, two cuEventRecord, and at harvest cuEventQuery and three
 * cuEventElapsedTime (its E, and its two events against the reference), plus one cuEventRecord of
 * the reference every REF_EVERY_NS: 8/SAMPLE = 0.25 per launch (bench/limiter_launch.py counts them).
 *
 * Over any few hundred milliseconds the container gets pct% of the device's time, so a
 * compute-bound loop runs at pct% of its unthrottled throughput, split among its processes
 * (tests/region/test_limiter.py and test_sm_share.py over a simulated time-slicing GPU,
 * tests/gpu/test_sm_share_gpu.py on a real one). Launches on concurrent streams are each charged
 * in full (conservative).
 *
 * Policy: GPU_CORE_UTILIZATION_POLICY=force always throttles, =disable never; otherwise we follow
 * the monitor's utilization_switch in the region (it lifts throttling when the GPU is not
 * contended). The percent in force is limits/'s rule (sm_in_force): the stricter of the
 * region's and this process's env, so a process that lost the container's environment still
 * holds the region's limit.
 *
 * Elastic (VGPU_SM_ELASTIC=1, per container, off by default): while the board shows no other container busy,
 * a limited container's debt is forgiven at each look (every launch that finds it in debt, at least every
 * HARVEST_NS), so it may use GPU time nobody else wants; its queue is kept within ELASTIC_AHEAD_NS of now.
 * Once another container is busy, the bucket starts from zero and the limit holds at its next launch. A
 * neighbour that forges busy entries only takes the elastic container back to its limit; one without a board
 * (or the shim) is not seen, as for every limited container.
 *
 * Priority (HAMi's CUDA_TASK_PRIORITY, kept in the region: 0 high, else low), without the monitor: a
 * high-priority container's tag on the board carries VGPU_BOARD_HIGH; while the board shows one busy, a
 * low-priority process's percent in force is YIELD_PCT (or its own limit, if lower), and it sleeps off its
 * debt in steps so it runs again within YIELD_STEP_NS of the high one's last mark. A neighbour can write
 * that claim, so it is checked against NVML's utilisation (decide_yield).
 *
 * The monitor's signals (whenever a region is attached, with or without an SM limit):
 * - recent_kernel < 0 means "hold back" (HAMi's monitor writes -1 into a lower-priority task's
 *   region while a higher-priority one is busy): launches wait in a sleep loop (1 ms growing to
 *   20 ms) until it is >= 0 again, at most MAX_HOLD_NS per launch (a monitor that died holding us
 *   slows us to one launch per MAX_HOLD_NS, with one warning, rather than hanging forever).
 *   Not with GPU_CORE_UTILIZATION_POLICY=disable, and never for a priority-0 (high) task.
 * - last_kernel_time (seconds) is written on launches at most once a second (and at creation,
 *   region/shm.c), and recent_kernel is marked RECENT_KERNEL_MARK unless the monitor made it
 *   negative, which we never overwrite.
 * We report our share of GPU time (what we charged) in our slot's device_util[dev].sm_util. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "limiter/board.h"
#include "limiter/bucket.h"
#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "limiter/occupancy.h"
#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

#define RING 64
#define SAMPLE 32                /* one launch in SAMPLE is measured (a power of two) */
#define SAMPLE_SHARED 4          /* ... while other contexts are busy: S is found sooner */
#define HARVEST_NS 2000000ll     /* 2 ms between harvests */
#define BURST_NS 20000000ll      /* at most 20 ms of GPU time banked */
#define HOLD_NS 10000000ll       /* after idle, a limit takes hold within this much wall time */
#define MIN_BURST_NS 200000ll
#define MAX_SLEEP_NS 500000000ll /* one sleep never exceeds 0.5 s (the debt carries over) */
#define MAX_HOLD_NS 30000000000ll
#define RECENT_KERNEL_MARK 2 /* "launched recently", for the monitor */
#define MAX_K 8              /* a board claiming more busy contexts is not believed beyond this */
#define STRETCH_NS 500000ll /* a launch whose share is this long spans the GPU's time slices */
#define SOLO 256             /* kernels remembered per device (direct-mapped by their shape) */
#define REF_EVERY_NS 4000000000ll /* the reference event is recorded afresh: drift and float precision */
#define MAP_SLACK_NS 200000ll     /* a mapped end later than this past the harvest: the mapping is off */
#define CENSUS_NS 250000000ll     /* NVML's process count is asked again after this long */
#define TURN_BATCH_NS 2000000ll   /* a batch within one time slice: its turn is its own */
#define WAITS 32                  /* the waits a turn's cost is taken from */
#define YIELD_PCT 5               /* a low-priority container's share while a high-priority one is busy */
#define LOOK_NS 1000000ll         /* a low-priority process looks for high-priority work this often */
#define FRAC_NS 250000000ll       /* the span over which how much of its time it yielded is kept (about NVML's
                                   * sample period, 1/6 s on datacenter GPUs) */
#define CHECK_FRAC_PPM 500000     /* ... once that is half, NVML is asked whether the GPU is in fact busy */
#define CHECK_NS 100000000ll      /* ... at most this often */
#define OTHERS_UTIL 10            /* percent of the GPU's time that others must be busy for a claim to hold */
#define DOUBT_NS 2000000000ll     /* a claim found false is not believed for this long, doubled each time */
#define MAX_DOUBT_NS 32000000000ll
#define YIELD_STEP_NS 10000000ll  /* a yielding process sleeps off its debt in steps this long */
#define ELASTIC_AHEAD_NS 2000000ll /* elastic and over the limit: at most this much work queued ahead */
#define SLACK_NS 1000             /* a throttle's sleep overshoots by at most about this (timer slack) */

VGPU_HIDDEN int vgpu_limiter_enabled = 0;

struct pair {
    CUevent start, end;
    int done;       /* end recorded: the pair can be harvested once `end` completes */
    int graph;      /* which estimate it feeds */
    long long t0;   /* launched (CLOCK_MONOTONIC ns) */
    long long late; /* a harvest found it unfinished then (0: none did) */
    uint64_t sig;
    unsigned ppm; /* what its charge is scaled by (VGPU_PPM: in full) */
    long long pre; /* charged when it was made (the estimate), settled at its harvest */
};

struct dev_state {
    pthread_mutex_t throttle_mu; /* launching threads of this device, one at a time when in debt */
    pthread_mutex_t mu;          /* the ring, the solo table, the harvest */
    CUcontext ctx;               /* the context our events belong to */
    struct pair ring[RING];
    int ready;           /* events created */
    unsigned head, tail; /* pairs in flight are [tail, head) */
    int others;          /* atomic: other busy contexts at the last harvest, or during the last launch harvested */
    long long next_harvest_ns; /* atomic read on the fast path */
    long long charged_ns;      /* atomic: GPU time charged since the last utilisation report */
    long long window_start_ns;
    long long est_ns[2]; /* atomic: one launch's charge, kernel / graph; < 0 = not measured yet */
    long long held_ns;   /* atomic: one launch's E, as measured (stretch included) */
    long long queue_end; /* atomic: when the work we queued should be done (for the board) */
    CUevent ref;         /* the reference event (mu): measured launches' event times in our clock */
    long long ref_at;    /* when it was last recorded; 0 never */
    long long anchor;    /* our clock at the reference's GPU time, the latest lower bound; LLONG_MIN none */
    struct {
        uint64_t sig;
        long long least; /* the least E seen */
        long long alone; /* the least E measured alone, -1 never */
    } solo[SOLO]; /* per launch shape (mu) */
    struct {
        uint64_t sig; /* atomic: 0 while est is rewritten for another shape */
        long long est; /* atomic: one launch's charge, this shape's own */
    } shape[SOLO]; /* per launch shape, written under mu, read lock-free on the fast path */
    int census;           /* other processes on the device, NVML says (mu); -1 unknown */
    long long census_at;  /* when it was asked */
    long long own_ns;     /* atomic: how long our launches have held our stream so far, as queued() counts them */
    long long floor_milli; /* (mu) contexts busy at least, by NVML's utilisation beyond ours; 0 none */
    long long floor_at, floor_own; /* (mu) when it was found, and own_ns then */
    long long batch_t0;   /* atomic: when the launch that found our queue drained was made; 0 none */
    int batch_n;          /* atomic: launches since */
    long long waits[WAITS]; /* (mu) the last batches' waits beside another container */
    unsigned nwaits;
    pthread_mutex_t yield_mu; /* one thread at a time decides whether we yield (trylock) */
    int yield_now;            /* atomic: we yield to a high-priority container now */
    long long yield_at;       /* atomic: when that was decided (0: never) */
    long long yield_ppm;      /* (yield_mu) how much of the last FRAC_NS or so we yielded, in ppm */
    long long checked_at;     /* (yield_mu) NVML last asked */
    long long doubt_until;    /* (yield_mu) the board's high-priority claims are not believed until then */
    long long doubt_ns;       /* (yield_mu) how long the last false claim was doubted (0: none lately) */
};

static struct dev_state dev_state[VGPU_MAX_DEVICES];
static int env_any; /* some env SM limit */
static int policy;
static int elastic; /* VGPU_SM_ELASTIC=1: over the limit while no other container is busy (see the top) */
static int charge_kind;       /* VGPU_CHARGE_TIME or _OCCUPANCY (VGPU_SM_CHARGE) */
static const char *bad_charge; /* a VGPU_SM_CHARGE we did not understand, warned about once */
static vgpu_limiter_ops_t ops;
static int ops_state; /* 0 unknown, 1 loaded, -1 missing */
static int one_device = -1; /* 1: the process sees one device, so a launch is on device 0 */
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
static long long last_stamp_s;
static int warned_hold;
static int warned_doubt;
/* the pair this thread opened in before_launch, closed by after_launch; -1 none */
static __thread int open_dev = -1;
static __thread unsigned open_slot;
static __thread unsigned rng;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static long long coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

VGPU_HIDDEN void vgpu_limiter_load_env(void)
{
    const char *pol = getenv("GPU_CORE_UTILIZATION_POLICY"), *how = getenv("VGPU_SM_CHARGE");
    int any = 0, d;

    policy = VGPU_POLICY_DEFAULT;
    if (pol && !strcasecmp(pol, "force"))
        policy = VGPU_POLICY_FORCE;
    else if (pol && !strcasecmp(pol, "disable"))
        policy = VGPU_POLICY_DISABLE;
    elastic = getenv("VGPU_SM_ELASTIC") && (!strcmp(getenv("VGPU_SM_ELASTIC"), "1") ||
                                            !strcasecmp(getenv("VGPU_SM_ELASTIC"), "true"));
    charge_kind = VGPU_CHARGE_TIME;
    bad_charge = 0;
    if (how && !strcasecmp(how, "occupancy"))
        charge_kind = VGPU_CHARGE_OCCUPANCY;
    else if (how && *how && strcasecmp(how, "time"))
        bad_charge = how; /* the default, HAMi's meaning: never a cheaper charge than asked for */
    for (d = 0; d < VGPU_MAX_DEVICES; d++)
        any |= vgpu_limits_env_sm(d) > 0;
    env_any = any;
    /* the hook also serves the monitor's signals and the activity board, so it is always on */
    __atomic_store_n(&vgpu_limiter_enabled, 1, __ATOMIC_RELAXED);
}

VGPU_HIDDEN int vgpu_limiter_throttles(void)
{
    return env_any && policy != VGPU_POLICY_DISABLE;
}

__attribute__((constructor)) static void limiter_ctor(void)
{
    vgpu_limiter_load_env(); /* env only: no driver, no thread */
}

/* the SM percent in force, 0 = none: limits/ decides over the region's raw word and the env, the stricter */
static uint64_t sm_in_force(int dev)
{
    return vgpu_limit_in_force(vgpu_sm_norm(vgpu_region_stored_sm_limit(dev)), vgpu_limits_env_sm(dev));
}

static int percent_of(const vgpu_region_t *r, int dev)
{
    uint64_t pct;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || policy == VGPU_POLICY_DISABLE)
        return 0;
    pct = sm_in_force(dev);
    if (!pct)
        return 0;
    if (policy == VGPU_POLICY_DEFAULT && r && !__atomic_load_n(&r->utilization_switch, __ATOMIC_RELAXED))
        return 0; /* the monitor says the device is not contended */
    return (int)pct;
}

VGPU_HIDDEN int vgpu_limiter_percent(int dev)
{
    return percent_of(vgpu_region_get(), dev);
}

static void init_states(void)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        pthread_mutex_init(&dev_state[d].throttle_mu, 0);
        pthread_mutex_init(&dev_state[d].mu, 0);
        pthread_mutex_init(&dev_state[d].yield_mu, 0);
        dev_state[d].est_ns[0] = dev_state[d].est_ns[1] = -1;
    }
}

static int load_ops(void)
{
    int s = __atomic_load_n(&ops_state, __ATOMIC_ACQUIRE), n = 0;
    if (s)
        return s > 0;
    s = vgpu_limiter_ops_load(&ops) == 0 ? 1 : -1;
    if (bad_charge && vgpu_limiter_throttles())
        VGPU_WARN("VGPU_SM_CHARGE=%.32s is neither time nor occupancy; launches are charged their time (the default)",
                  bad_charge);
    if (s < 0 && vgpu_limiter_throttles())
        VGPU_WARN("SM limit set but the driver lacks the event entry points; launches are not throttled");
    else if (s > 0)
        one_device = ops.device_count(&n) == CUDA_SUCCESS && n == 1;
    __atomic_store_n(&ops_state, s, __ATOMIC_RELEASE);
    return s > 0;
}

/* ---- the monitor's signals ---- */

static void sleep_ns(long long ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000ll);
    ts.tv_nsec = (long)(ns % 1000000000ll);
    nanosleep(&ts, 0);
}

/* a throttle's sleep, as long as it was asked to be: a thread's timer slack (50 us unless set) is added
 * to every sleep, so a 10 us step that owed 10 us waited 60 and then ran a few steps free, and a step loop's
 * p99 was 6-9 x its p50 on an H100 (bench/gpu_steps.py). The slack is the thread's own, and put back. */
static void sleep_exact(long long ns)
{
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);

    if (slack > SLACK_NS)
        prctl(PR_SET_TIMERSLACK, (unsigned long)SLACK_NS, 0, 0, 0);
    sleep_ns(ns);
    if (slack > SLACK_NS)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}

static void hold(vgpu_region_t *r)
{
    long long waited = 0, step = 1000000ll;

    while (__atomic_load_n(&r->recent_kernel, __ATOMIC_ACQUIRE) < 0) {
        if (waited >= MAX_HOLD_NS) {
            if (!__atomic_exchange_n(&warned_hold, 1, __ATOMIC_RELAXED))
                VGPU_WARN("the monitor has held launches back for %lld s (recent_kernel < 0); launching one "
                          "anyway, and so once per %lld s while it lasts", MAX_HOLD_NS / 1000000000ll,
                          MAX_HOLD_NS / 1000000000ll);
            return;
        }
        sleep_ns(step);
        waited += step;
        if (step < 20000000ll)
            step *= 2;
    }
}

/* at most once a second: last_kernel_time (and recent_kernel unless the monitor made it negative) */
static void stamp_launch(vgpu_region_t *r)
{
    struct timespec ts;
    long long s, prev;
    int rk;

    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    s = (long long)ts.tv_sec;
    prev = __atomic_load_n(&last_stamp_s, __ATOMIC_RELAXED);
    if (s == prev || !__atomic_compare_exchange_n(&last_stamp_s, &prev, s, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&r->last_kernel_time, (uint64_t)s, __ATOMIC_RELAXED);
    rk = __atomic_load_n(&r->recent_kernel, __ATOMIC_RELAXED);
    if (rk >= 0 && rk != RECENT_KERNEL_MARK)
        __atomic_compare_exchange_n(&r->recent_kernel, &rk, RECENT_KERNEL_MARK, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
}

static void signals(vgpu_region_t *r)
{
    if (VGPU_UNLIKELY(__atomic_load_n(&r->recent_kernel, __ATOMIC_RELAXED) < 0) && policy != VGPU_POLICY_DISABLE &&
        __atomic_load_n(&r->priority, __ATOMIC_RELAXED) != 0)
        hold(r);
    stamp_launch(r);
}

/* ---- the activity board ---- */

/* our container on the board: its region file (the same file for all its processes), else this process;
 * VGPU_BOARD_HIGH when the region says priority 0 */
static uint32_t container_tag(void)
{
    vgpu_region_t *r = vgpu_region_get();
    uint64_t d = 0, i = 0, h;

    if (r)
        vgpu_region_file_id(&d, &i);
    h = d || i ? d * 0x9e3779b97f4a7c15ull ^ i : (uint64_t)getpid() << 20 ^ (uint64_t)now_ns();
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return (((uint32_t)(h >> 32) | 1) & ~VGPU_BOARD_HIGH) |
           (r && __atomic_load_n(&r->priority, __ATOMIC_RELAXED) == 0 ? VGPU_BOARD_HIGH : 0);
}

static void board_join(int dev)
{
    char key[VGPU_UUID_LEN];

    if (ops.device_key(dev, key, sizeof key) != 0)
        key[0] = 0; /* no UUID: no board (a file named by ordinal would mix up GPUs across containers) */
    vgpu_board_join(dev, key, container_tag(), ops.gpu_procs);
}

/* ---- measuring ---- */

/* events live in one context; a launch on another context's stream is not measured */
static int ensure_events(struct dev_state *st)
{
    CUcontext cur = 0;
    int i;

    if (ops.ctx_get_current(&cur) != CUDA_SUCCESS || !cur)
        return 0;
    if (st->ready)
        return st->ctx == cur;
    for (i = 0; i < RING; i++)
        if ((!st->ring[i].start && ops.event_create(&st->ring[i].start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) ||
            (!st->ring[i].end && ops.event_create(&st->ring[i].end, CU_EVENT_DEFAULT) != CUDA_SUCCESS))
            return 0; /* the ones created are kept for the next try */
    if (!st->ref && ops.event_create(&st->ref, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        st->ref = 0; /* no mapping: launches are placed between their launch and harvest */
    st->ctx = cur;
    st->ready = 1;
    st->window_start_ns = now_ns();
    return 1;
}

static void charge(struct dev_state *st, vgpu_ledger_t *b, long long ns)
{
    vgpu_bucket_charge(b, ns);
    __atomic_fetch_add(&st->charged_ns, ns, __ATOMIC_RELAXED);
}

/* a charge scaled by the share of the SMs its launch holds (ppm) */
static long long scaled(long long ns, unsigned ppm)
{
    return ppm >= VGPU_PPM ? ns : ns / VGPU_PPM * ppm + ns % VGPU_PPM * ppm / VGPU_PPM;
}

static unsigned solo_slot(uint64_t sig)
{
    sig ^= sig >> 29;
    sig *= 0xbf58476d1ce4e5b9ull;
    return (unsigned)(sig >> 40) & (SOLO - 1);
}

/* this kernel shape's own running estimate of one launch's charge; -1 none (never measured, or its slot
 * has another shape's now). Lock-free: the slot's sig is read before and after its est */
static long long shape_est(struct dev_state *st, uint64_t sig)
{
    unsigned i = solo_slot(sig);
    long long est;

    if (!sig || __atomic_load_n(&st->shape[i].sig, __ATOMIC_ACQUIRE) != sig)
        return -1;
    est = __atomic_load_n(&st->shape[i].est, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&st->shape[i].sig, __ATOMIC_ACQUIRE) == sig ? est : -1;
}

/* no shape has sig's slot yet */
static int shape_free(struct dev_state *st, uint64_t sig)
{
    return !__atomic_load_n(&st->shape[solo_slot(sig)].sig, __ATOMIC_RELAXED);
}

/* mu held: a measured launch of shape sig was charged ns */
static void shape_learn(struct dev_state *st, uint64_t sig, long long ns)
{
    unsigned i = solo_slot(sig);
    long long est = __atomic_load_n(&st->shape[i].est, __ATOMIC_RELAXED);

    if (!sig)
        return;
    if (__atomic_load_n(&st->shape[i].sig, __ATOMIC_RELAXED) == sig) {
        __atomic_store_n(&st->shape[i].est, est + (ns - est) / 4, __ATOMIC_RELEASE);
        return;
    }
    __atomic_store_n(&st->shape[i].sig, 0, __ATOMIC_RELEASE); /* readers miss while the slot changes hands */
    __atomic_store_n(&st->shape[i].est, ns, __ATOMIC_RELEASE);
    __atomic_store_n(&st->shape[i].sig, sig, __ATOMIC_RELEASE);
}

/* mu held: our own share of a measured launch that held its stream for e ns (see the top), others
 * busy beside it k_milli / 1000 - 1 on average (0: nobody at any time) */
static long long own_share(struct dev_state *st, const struct pair *p, long long e, long long k_milli, int sure)
{
    unsigned i = solo_slot(p->sig);
    long long least = -1, alone = -1, share, floor;

    if (st->solo[i].sig == p->sig) {
        least = st->solo[i].least;
        alone = st->solo[i].alone;
    } else {
        st->solo[i].sig = p->sig;
        st->solo[i].alone = -1;
    }
    if (least < 0 || e < least)
        st->solo[i].least = least = e;
    if (k_milli <= 1000) { /* alone the whole time: E is the truth */
        if (sure && (alone < 0 || e < alone)) /* the least: a neighbour that joined unseen only ever adds */
            st->solo[i].alone = e;
        return e;
    }
    share = e * 1000 / k_milli;
    if (share >= STRETCH_NS) { /* long enough to span time slices: stretched by every busy context */
        if (alone < 0)
            return share;
        /* its time alone is its own time (the GPU's switching between contexts is nobody's), but never
         * less than a share among one more context than the board counts */
        floor = e < alone ? e : alone;
        share = e * 1000 / (k_milli + 1000);
        return floor > share ? floor : share;
    }
    floor = e < least ? e : least; /* short: takes turns with the others; E is its own */
    return share > floor ? share : floor;
}

/* mu held: when a launch that held its stream for e ns ran, in our clock: *from and *to. Mapped
 * through the reference event when it can be, else from its launch (or from e before a harvest last
 * found it unfinished: it ended after that) to now. */
static void when_ran(struct dev_state *st, const struct pair *p, long long e, long long now, long long *from,
                     long long *to)
{
    float a, z;
    long long lo, end;

    *from = p->late - e > p->t0 ? p->late - e : p->t0;
    *to = now;
    if (!st->ref_at || st->ref_at > p->t0 || ops.event_elapsed(&a, st->ref, p->start) != CUDA_SUCCESS ||
        ops.event_elapsed(&z, st->ref, p->end) != CUDA_SUCCESS)
        return;
    lo = p->t0 - (long long)((double)a * 1e6); /* its start completed after it was recorded */
    if (lo > st->anchor)
        st->anchor = lo;
    end = st->anchor + (long long)((double)z * 1e6);
    if (end > now + MAP_SLACK_NS) { /* ended after we saw it done: the clocks drifted apart */
        st->anchor = LLONG_MIN;
        return;
    }
    *to = end < now ? end : now;
    *from = *to - e > p->t0 ? *to - e : p->t0;
}

/* mu held: the GPU's own count of other processes on dev (NVML), at most CENSUS_NS old; -1 unknown.
 * No file a neighbour writes can raise it, so it bounds what the board may claim. None seen counts as
 * unknown: an NVML that cannot see other pid namespaces lists only us, and capping by it would charge
 * every stretched kernel in full. */
static int census(struct dev_state *st, int dev, long long now)
{
    int n;

    if (st->census_at && now - st->census_at < CENSUS_NS)
        return st->census;
    st->census_at = now;
    n = ops.gpu_procs ? ops.gpu_procs(dev) : -1;
    return st->census = n > 1 ? n - 1 : -1; /* we are one of them */
}

/* mu held: how many contexts at least, ours included, in thousandths, the GPU itself says were busy lately:
 * NVML's utilisation (the share of time any kernel ran) beyond the time our own launches held our stream (their
 * stretch included, so it never counts others that were not there; what we were charged would: a process alone
 * and charged less than its time found room for others in its own work), over about CENSUS_NS; 0 when
 * it shows less than OTHERS_UTIL beyond ours, or NVML has none. No file a neighbour writes moves it: a forger that
 * rewrites every entry of the board, the one a busy neighbour just took included, hides that neighbour's time
 * from the board (a late 10 beside an unlimited one then got 0.06-0.077 over the simulated GPU, charged as if
 * alone), but not from the GPU. At most one other context: utilisation cannot tell one busy neighbour from
 * several. */
static long long busy_floor(struct dev_state *st, int dev, long long now)
{
    long long own = __atomic_load_n(&st->own_ns, __ATOMIC_RELAXED), others;
    int util;

    if (st->floor_at && now - st->floor_at < CENSUS_NS)
        return st->floor_milli;
    st->floor_milli = 0;
    if (ops.gpu_util && (st->floor_at || census(st, dev, now) > 0) && (util = ops.gpu_util(dev)) >= 0) {
        /* the first look, where NVML lists others, takes none of the utilisation for ours: we have hardly run
         * yet. Waiting a CENSUS_NS to know, a late 10's first 32 launches (queued before any was measured)
         * were all charged as if alone, and it slept off 1.3 s of debt (0.054 in the window after) */
        others = util * 10ll - (st->floor_at && now > st->floor_at ? (own - st->floor_own) * 1000 / (now - st->floor_at)
                                                                   : 0);
        if (others >= OTHERS_UTIL * 10)
            st->floor_milli = 1000 + (others < 1000 ? others : 1000);
    }
    st->floor_at = now;
    st->floor_own = own;
    return st->floor_milli;
}

/* mu held: how many contexts, on average and ours included, in thousandths, were busy within
 * [from, to]; *sure is 0 when the board's history does not reach back that far (then the others
 * busy now stand in) */
static long long contexts_milli(struct dev_state *st, int dev, long long from, long long to, int *sure)
{
    long long busy, k, cap, floor;
    int n;

    *sure = 1;
    if (to <= from)
        return 1000;
    busy = vgpu_board_busy(dev, from, to);
    if (busy < 0) {
        *sure = 0;
        k = 1000 + 1000ll * vgpu_board_others(dev);
    } else {
        k = 1000 + (busy > 0 ? busy * 1000 / (to - from) : 0);
        if (busy > 0 && k == 1000)
            k = 1001; /* someone was busy meanwhile: not alone */
    }
    if (k < (floor = busy_floor(st, dev, to)))
        k = floor; /* the GPU was busier than the board shows */
    if (k > 1000) {
        /* the board claims more busy neighbours than the GPU has processes; an NVML that lists only us (one that
         * filters by pid namespace would) bounds them at one: forged busy entries then made a 30 beside a 70
         * take 0.445, the 70 left 0.489 */
        n = census(st, dev, to);
        cap = 1000ll * (1 + (n >= 0 ? n : 1));
        if (k > cap)
            k = cap;
    }
    return k < MAX_K * 1000 ? k : MAX_K * 1000;
}

/* mu held: charge every measured launch whose end event has completed, oldest first; st->others
 * (for the sampling rate) says whether others are busy now or were during the last one */
static void harvest(struct dev_state *st, vgpu_ledger_t *b, int dev)
{
    long long now = now_ns();
    int others, sure;

    vgpu_board_sample(dev); /* the others' busy time up to now, before any launch is placed */
    others = vgpu_board_others(dev);
    while (st->tail != st->head) {
        struct pair *p = &st->ring[st->tail % RING];
        long long ns, est, k, from, to;
        float ms = 0;

        if (!p->done || ops.event_query(p->end) != CUDA_SUCCESS) {
            p->late = now;
            break;
        }
        if (ops.event_elapsed(&ms, p->start, p->end) != CUDA_SUCCESS || ms < 0)
            ms = 0;
        ns = (long long)((double)ms * 1e6);
        est = __atomic_load_n(&st->held_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&st->held_ns, est <= 0 ? ns : est + (ns - est) / 4, __ATOMIC_RELAXED);
        when_ran(st, p, ns, now, &from, &to);
        k = contexts_milli(st, dev, from, to, &sure);
        if (k > 1000 && !others)
            others = 1;
        ns = own_share(st, p, ns, k, sure && !others); /* nobody busy now either: A may be learnt */
        charge(st, b, scaled(ns, p->ppm) - p->pre); /* a refund when the estimate charged ahead was more */
        est = __atomic_load_n(&st->est_ns[p->graph], __ATOMIC_RELAXED);
        __atomic_store_n(&st->est_ns[p->graph], est < 0 ? ns : est + (ns - est) / 4, __ATOMIC_RELAXED);
        if (!p->graph)
            shape_learn(st, p->sig, ns);
        p->done = 0;
        st->tail++;
    }
    __atomic_store_n(&st->others, others, __ATOMIC_RELAXED);
}

/* once a second: our measured SM share in our slot's sm_util */
static void report_util(struct dev_state *st, int dev, long long now)
{
    vgpu_proc_slot_t *me;
    long long window = now - st->window_start_ns, util;

    if (window < 1000000000ll)
        return;
    me = vgpu_region_self();
    util = __atomic_exchange_n(&st->charged_ns, 0, __ATOMIC_RELAXED) * 100 / window;
    if (me)
        __atomic_store_n(&me->device_util[dev].sm_util, (uint64_t)(util > 100 ? 100 : util < 0 ? 0 : util),
                         __ATOMIC_RELAXED);
    st->window_start_ns = now;
}

static unsigned next_rand(void)
{
    unsigned x = rng ? rng : (unsigned)(uintptr_t)&rng ^ 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return rng = x ? x : 1;
}

/* the most the bucket may hold now: BURST_NS while the container works; once nobody of it has refilled the
 * bucket for HOLD_NS (idle, or a fresh bucket) and our own queue has drained that long, what running flat
 * out for HOLD_NS spends beyond pct%. Our queue alone is not enough: a container of 3 processes at 30, each
 * asleep in turn while the others ran, then got 0.243-0.274 over the simulated GPU (0.274-0.282 without it) */
static long long burst_now(struct dev_state *st, const vgpu_ledger_t *b, int pct, long long now)
{
    long long onset = HOLD_NS * (100 - pct) / 100, gap = now - vgpu_bucket_refilled_at(b);

    if (now - __atomic_load_n(&st->queue_end, __ATOMIC_RELAXED) < HOLD_NS || (gap >= 0 && gap < HOLD_NS))
        return BURST_NS;
    return onset < MIN_BURST_NS ? MIN_BURST_NS : onset;
}

/* mu held: bring the bucket up to date; returns how long to sleep to pay the debt (0: none) */
static long long account(struct dev_state *st, vgpu_ledger_t *b, int dev, int pct)
{
    long long now = now_ns(), debt, tokens;

    vgpu_bucket_refill(b, dev, pct, now, burst_now(st, b, pct, now));
    harvest(st, b, dev);
    report_util(st, dev, now);
    __atomic_store_n(&st->next_harvest_ns, now + HARVEST_NS, __ATOMIC_RELAXED);
    tokens = vgpu_bucket_tokens(b);
    if (elastic && vgpu_board_state(dev) > 0 && !vgpu_board_foreign(dev)) {
        /* elastic, and no other container busy (harvest just looked): the debt is forgiven, so the limit holds
         * again from the moment another one is; our queue is kept within ELASTIC_AHEAD_NS of now, so the GPU
         * is theirs that soon after their first launch */
        long long ahead = __atomic_load_n(&st->queue_end, __ATOMIC_RELAXED) - now - ELASTIC_AHEAD_NS;
        if (tokens < 0)
            vgpu_bucket_charge(b, tokens);
        return ahead > 0 ? ahead : 0;
    }
    if (tokens >= 0)
        return 0;
    debt = -tokens * 100 / pct; /* wall time that refills the bucket to zero */
    /* 0.95x .. 1.05x: a container's processes do not wake in lockstep, and one whose wake came late still owes
     * at its next launch (with a quarter either way, a late wake left a step unpaid and the next paid two; a
     * tenth still set a step loop's p99 at 1.19 x its p50) */
    debt += debt * (long long)(next_rand() % 512u) / 5120 - debt / 20;
    return debt > MAX_SLEEP_NS ? MAX_SLEEP_NS : debt;
}

static void batch_cut(struct dev_state *st, int dev);
static void pay(struct dev_state *st, int dev, long long debt);

/* a batch of short launches is open: our queue has not drained since its first */
static int batch_open_short(struct dev_state *st)
{
    long long held = __atomic_load_n(&st->held_ns, __ATOMIC_RELAXED);
    return __atomic_load_n(&st->batch_t0, __ATOMIC_RELAXED) && held > 0 &&
           __atomic_load_n(&st->batch_n, __ATOMIC_RELAXED) * held < TURN_BATCH_NS;
}

/* throttle_mu held: pay any debt; when `measure`, open an event pair on the stream */
static void do_before(struct dev_state *st, vgpu_ledger_t *b, int dev, int pct, CUstream stream, int measure,
                      int graph, uint64_t sig, unsigned ppm, long long pre)
{
    long long debt;
    CUevent wait_for = 0;
    struct pair *p;

    pthread_mutex_lock(&st->mu);
    debt = account(st, b, dev, pct);
    if (debt && batch_open_short(st) && vgpu_bucket_tokens(b) > -TURN_BATCH_NS)
        debt = 0; /* paid before the next batch: a sleep now would cost the GPU a turn more (see the top) */
    if (measure && st->head - st->tail == RING) { /* CPU too far ahead: wait for the oldest launch */
        p = &st->ring[st->tail % RING];
        if (p->done)
            wait_for = p->end;
        else
            measure = 0; /* another thread is between its before and after: leave this one unmeasured */
    }
    pthread_mutex_unlock(&st->mu);
    if (wait_for)
        ops.event_sync(wait_for);
    if (debt) {
        if (__atomic_load_n(&st->queue_end, __ATOMIC_RELAXED) < now_ns() + debt)
            batch_cut(st, dev); /* our queue drains while we sleep: the launch after it begins a new batch */
        pay(st, dev, debt);
    }
    if (!measure && !wait_for && !debt)
        return;
    pthread_mutex_lock(&st->mu);
    if (wait_for || debt) {
        vgpu_bucket_refill(b, dev, pct, now_ns(), BURST_NS);
        harvest(st, b, dev);
    }
    if (measure && st->head - st->tail < RING) {
        long long t0 = now_ns();
        p = &st->ring[st->head % RING];
        if (st->ref && (!st->ref_at || t0 - st->ref_at > REF_EVERY_NS) &&
            ops.event_record(st->ref, stream) == CUDA_SUCCESS) {
            st->ref_at = t0;
            st->anchor = LLONG_MIN;
        }
        if (ops.event_record(p->start, stream) == CUDA_SUCCESS) { /* else another context's stream */
            p->done = 0;
            p->graph = graph;
            p->sig = sig;
            p->ppm = ppm;
            p->pre = pre;
            p->t0 = t0; /* before the record: its start cannot complete earlier */
            p->late = 0;
            open_dev = dev;
            open_slot = st->head++;
        }
    }
    pthread_mutex_unlock(&st->mu);
}

static int states_ready;

/* one more launch queued: on the board, we are busy until the queue should have drained, each launch
 * counted at how long launches have lately held our stream (stretched by the neighbours' time slices
 * as they are: our work is queued that long), or at its charge until one was measured */
static void queued(struct dev_state *st, int dev, int graph)
{
    long long now = now_ns(), end = __atomic_load_n(&st->queue_end, __ATOMIC_RELAXED),
              held = __atomic_load_n(&st->held_ns, __ATOMIC_RELAXED);

    held = held > 0 ? held : __atomic_load_n(&st->est_ns[graph], __ATOMIC_RELAXED);
    end = (end > now ? end : now) + held;
    __atomic_fetch_add(&st->own_ns, held > 0 ? held : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&st->queue_end, end, __ATOMIC_RELAXED);
    vgpu_board_until(dev, end);
}

static void throttle(CUstream stream, int dev, int pct, int graph, uint64_t sig, const vgpu_grid_t *grid)
{
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    struct dev_state *st;
    vgpu_ledger_t *b;
    long long est;
    int measure;
    unsigned rate, ppm = VGPU_PPM;
    long long pre = 0;
    int others_busy;

    if (VGPU_UNLIKELY(!__atomic_load_n(&states_ready, __ATOMIC_ACQUIRE))) {
        pthread_once(&state_once, init_states);
        __atomic_store_n(&states_ready, 1, __ATOMIC_RELEASE);
    }
    st = &dev_state[dev];
    b = vgpu_bucket_of(dev);
    est = __atomic_load_n(&st->est_ns[graph], __ATOMIC_RELAXED);
    others_busy = __atomic_load_n(&st->others, __ATOMIC_RELAXED) != 0;
    rate = others_busy ? SAMPLE_SHARED : SAMPLE;
    measure = est < 0 || !st->ready || (next_rand() & (rate - 1)) == 0;
    if (!graph && sig && est >= 0) { /* (no shape: a launch with no config, refused by the driver anyway) */
        long long own = shape_est(st, sig);
        if (own >= 0)
            est = own;
        else if (__atomic_load_n(&st->head, __ATOMIC_RELAXED) - __atomic_load_n(&st->tail, __ATOMIC_RELAXED) <
                     RING / 2 &&
                 (shape_free(st, sig) || (next_rand() & (SAMPLE_SHARED - 1)) == 0))
            measure = 1; /* a shape not measured yet: measured now (while the ring has room), not charged
                          * what another shape's launches cost (decode steps after prefill paid 9 x bare at 50);
                          * one whose slot another shape holds, one time in SAMPLE_SHARED: more shapes than
                          * slots must not make every launch a measured one */
    }
    if (charge_kind == VGPU_CHARGE_OCCUPANCY && !graph)
        ppm = vgpu_occupancy_ppm(&ops, dev, sig, grid);
    if (!measure) {
        /* the common case: charge the estimate, no driver call, no lock unless in debt or due */
        charge(st, b, scaled(est, ppm));
        long long now = coarse_ns();
        if (VGPU_LIKELY(vgpu_bucket_tokens(b) >= 0 && now < __atomic_load_n(&st->next_harvest_ns, __ATOMIC_RELAXED) &&
                        (!elastic || __atomic_load_n(&st->queue_end, __ATOMIC_RELAXED) < now + ELASTIC_AHEAD_NS)))
            goto launch; /* (an elastic process's forgiven debt would let it queue far ahead: it looks then) */
    } else {
        /* recording into a capturing stream would tie our events to the user's graph: the graph's
         * launch is measured instead (and nothing runs now) */
        if (ops.stream_is_capturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE)
            return;
        pthread_mutex_lock(&st->mu);
        if (!ensure_events(st))
            measure = 0;
        pthread_mutex_unlock(&st->mu);
        if (!measure && !st->ready)
            goto launch;
        if (!measure && est > 0) /* another context's stream: charged like an unmeasured launch */
            charge(st, b, scaled(est, ppm));
        /* alone on the GPU, a measured launch is charged the estimate now too, and settled at its harvest:
         * charged only then, it let its step run free and the next one pay for two (a step loop's p99 at
         * 1.6 x its p50). Not beside busy others: there a container of two processes with stretched kernels
         * then got 0.54-0.57 at SM 50 over the simulated GPU, where it gets 0.48 charged at the harvest. */
        if (measure && est > 0 && !others_busy)
            charge(st, b, pre = scaled(est, ppm));
    }
    pthread_mutex_lock(&st->throttle_mu);
    do_before(st, b, dev, pct, stream, measure, graph, sig, ppm, pre);
    pthread_mutex_unlock(&st->throttle_mu);
launch:
    queued(st, dev, graph); /* after any debt is paid: asleep, we are not busy */
    if (!__atomic_load_n(&st->batch_t0, __ATOMIC_RELAXED))
        __atomic_store_n(&st->batch_t0, now_ns(), __ATOMIC_RELAXED); /* our queue was drained: a batch begins */
    __atomic_fetch_add(&st->batch_n, 1, __ATOMIC_RELAXED);
}

/* mu held: the turn's cost as we have seen it, the second least of the last waits (their noise only adds: the launch, the wake-up); -1 too few yet */
static long long turn_cost(struct dev_state *st)
{
    long long w[WAITS], x;
    unsigned n = st->nwaits < WAITS ? st->nwaits : WAITS, i, j;

    if (n < 4)
        return -1;
    for (i = 0; i < n; i++) { /* insertion sort: 32 at most */
        x = st->waits[i];
        for (j = i; j > 0 && w[j - 1] > x; j--)
            w[j] = w[j - 1];
        w[j] = x;
    }
    return w[n / 32];
}

/* mu held: the turn's cost, charged to a batch of n launches that met another container busy */
static void charge_turn(struct dev_state *st, int dev, long long n, long long wait)
{
    long long cost;

    if (wait >= 0)
        st->waits[st->nwaits++ % WAITS] = wait;
    cost = turn_cost(st);
    if (n > 0 && cost > 0)
        charge(st, vgpu_bucket_of(dev), wait >= 0 && wait < cost ? wait : cost);
}

/* a launch is about to sleep off debt with a batch open: its queue drains meanwhile, so the batch ends
 * here, its wait unknown yet: it is charged the turn's cost if another container was busy */
static void batch_cut(struct dev_state *st, int dev)
{
    long long t0 = __atomic_exchange_n(&st->batch_t0, 0, __ATOMIC_RELAXED),
              n = __atomic_exchange_n(&st->batch_n, 0, __ATOMIC_RELAXED),
              held = __atomic_load_n(&st->held_ns, __ATOMIC_RELAXED);

    if (!t0 || n <= 0 || held <= 0 || n * held >= TURN_BATCH_NS || !vgpu_board_foreign(dev))
        return;
    pthread_mutex_lock(&st->mu);
    charge_turn(st, dev, n, -1);
    pthread_mutex_unlock(&st->mu);
}

/* a wait for the GPU just drained our queue on dev: the batch that began at batch_t0 is done; charge
 * it the turn to us (see the top) */
static void batch_done(int dev)
{
    struct dev_state *st = &dev_state[dev];
    long long t0, n, held, wait, now;
    int pct;

    if (!__atomic_load_n(&states_ready, __ATOMIC_ACQUIRE) || !(t0 = __atomic_exchange_n(&st->batch_t0, 0,
                                                                                           __ATOMIC_RELAXED)))
        return;
    n = __atomic_exchange_n(&st->batch_n, 0, __ATOMIC_RELAXED);
    held = __atomic_load_n(&st->held_ns, __ATOMIC_RELAXED);
    now = now_ns();
    if (n <= 0 || held <= 0 || n * held >= TURN_BATCH_NS || (wait = now - t0 - n * held) <= 0 ||
        !(pct = percent_of(vgpu_region_get(), dev)))
        return; /* long batches take their turns at time slices, charged to nobody as before */
    vgpu_board_sample(dev);
    if (!vgpu_board_foreign(dev))
        return; /* alone, or beside our own container's processes */
    pthread_mutex_lock(&st->mu);
    charge_turn(st, dev, n, wait);
    pthread_mutex_unlock(&st->mu);
}

/* ---- priority: a low-priority container yields to a busy high-priority one ---- */

/* yield_mu held: whether we yield now. The board says whether a high-priority container of the GPU is
 * busy; a neighbour can write that claim, so it is checked against NVML's utilisation of the whole GPU
 * once we have yielded long enough for our own part of it to be small: what we may have used (all the
 * time we did not yield, YIELD_PCT of the time we did) taken off, others must still keep the GPU
 * OTHERS_UTIL busy. A claim that fails (or an NVML without utilisation) is not believed for DOUBT_NS,
 * doubled at each failure up to MAX_DOUBT_NS; a claim that holds resets that. */
static void decide_yield(struct dev_state *st, int dev)
{
    long long now = now_ns(), dt = now - st->yield_at, a, ours;
    int y, util;

    if (st->yield_at && dt > 0) { /* the last FRAC_NS or so: what we yielded then */
        a = dt >= FRAC_NS ? 1000000 : dt * 1000000 / FRAC_NS;
        st->yield_ppm += ((long long)st->yield_now * 1000000 - st->yield_ppm) * a / 1000000;
    }
    __atomic_store_n(&st->yield_at, now, __ATOMIC_RELAXED);
    vgpu_board_sample(dev);
    y = vgpu_board_high(dev) > 0 && now >= st->doubt_until;
    if (y && st->yield_ppm >= CHECK_FRAC_PPM && now - st->checked_at >= CHECK_NS) {
        st->checked_at = now;
        util = ops.gpu_util ? ops.gpu_util(dev) : -1;
        ours = 100 - st->yield_ppm * (100 - YIELD_PCT) / 1000000;
        if (util - ours < OTHERS_UTIL) {
            st->doubt_ns = st->doubt_ns ? (st->doubt_ns * 2 < MAX_DOUBT_NS ? st->doubt_ns * 2 : MAX_DOUBT_NS)
                                        : DOUBT_NS;
            st->doubt_until = now + st->doubt_ns;
            y = 0;
            if (!__atomic_exchange_n(&warned_doubt, 1, __ATOMIC_RELAXED))
                VGPU_WARN("device %d: the GPU activity board shows a high-priority container busy, but NVML %s; "
                          "not yielding to it for %lld s (and longer each time it recurs)", dev,
                          util < 0 ? "gives no utilisation to check that by" : "shows the GPU mostly idle",
                          st->doubt_ns / 1000000000ll);
        } else {
            st->doubt_ns = 0;
        }
    }
    __atomic_store_n(&st->yield_now, y, __ATOMIC_RELAXED);
}

/* the percent in force, lowered to YIELD_PCT while we yield (a priority other than 0, HAMi's low) */
static int yielded(vgpu_region_t *r, int dev, int pct)
{
    struct dev_state *st = &dev_state[dev];

    if (!r || policy == VGPU_POLICY_DISABLE || __atomic_load_n(&r->priority, __ATOMIC_RELAXED) == 0)
        return pct;
    if (coarse_ns() - __atomic_load_n(&st->yield_at, __ATOMIC_RELAXED) >= LOOK_NS &&
        pthread_mutex_trylock(&st->yield_mu) == 0) {
        decide_yield(st, dev);
        pthread_mutex_unlock(&st->yield_mu);
    }
    if (!__atomic_load_n(&st->yield_now, __ATOMIC_RELAXED))
        return pct;
    return pct && pct < YIELD_PCT ? pct : YIELD_PCT;
}

/* throttle_mu held: sleep off a debt; while we yield, in steps, and no longer once we stop (what we owe
 * then was owed to the high-priority container's work) */
static void pay(struct dev_state *st, int dev, long long debt)
{
    long long step;

    if (!__atomic_load_n(&st->yield_now, __ATOMIC_RELAXED)) {
        sleep_exact(debt);
        return;
    }
    while (debt > 0 && __atomic_load_n(&st->yield_now, __ATOMIC_RELAXED)) {
        step = debt < YIELD_STEP_NS ? debt : YIELD_STEP_NS;
        sleep_exact(step);
        debt -= step;
        yielded(vgpu_region_get(), dev, 0); /* decides again, at most every LOOK_NS */
    }
}

VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream stream, int graph, uint64_t sig, const vgpu_grid_t *grid)
{
    vgpu_region_t *r = vgpu_region_get();
    CUdevice dev = 0;
    int pct, joined;

    open_dev = -1;
    if (r)
        signals(r);
    if (!load_ops() || (!one_device && (ops.ctx_get_device(&dev) != CUDA_SUCCESS || dev < 0 ||
                                        dev >= VGPU_MAX_DEVICES)))
        return;
    joined = vgpu_board_state(dev);
    if (VGPU_UNLIKELY(!joined))
        board_join(dev);
    /* the region's limit counts even when this process's env has none (a scrubbed environment) */
    if (!(pct = yielded(r, dev, percent_of(r, dev)))) {
        vgpu_board_mark(dev); /* unmeasured: busy for a while after each launch */
        return;
    }
    /* measured: busy until our queue should have drained, not a flat while after each launch, which
     * outlasts a throttled container's short bursts and made its neighbours see two contexts busy
     * (and charge themselves half) while they ran alone */
    throttle(stream, dev, pct, graph ? 1 : 0, sig, grid);
}

VGPU_HIDDEN int vgpu_limiter_before_wait(void)
{
    CUdevice dev = 0;

    if (!load_ops() || (!one_device && (ops.ctx_get_device(&dev) != CUDA_SUCCESS || dev < 0 ||
                                        dev >= VGPU_MAX_DEVICES)))
        return -1;
    if (vgpu_board_state(dev) <= 0)
        return -1;
    vgpu_board_hold(dev);
    return dev;
}

VGPU_HIDDEN void vgpu_limiter_after_wait(int dev)
{
    if (dev >= 0 && dev < VGPU_MAX_DEVICES) {
        vgpu_board_release(dev);
        batch_done(dev);
    }
}

VGPU_HIDDEN void vgpu_limiter_after_launch(CUstream stream)
{
    struct dev_state *st;
    struct pair *p;

    if (open_dev < 0)
        return;
    st = &dev_state[open_dev];
    open_dev = -1;
    pthread_mutex_lock(&st->mu);
    p = &st->ring[open_slot % RING];
    if (ops.event_record(p->end, stream) != CUDA_SUCCESS)
        ops.event_record(p->end, 0); /* cannot fail silently: an open pair would stall harvesting */
    p->done = 1;
    pthread_mutex_unlock(&st->mu);
}
