/* === LIMITER: the SM (compute) limiter, CUDA_DEVICE_SM_LIMIT[_<i>] percent of GPU time.
 *
 * No thread, and nothing at all on launches when no SM limit is set: vgpu_limiter_enabled stays 0
 * and the launch wrappers only test it. With a limit, every kernel, cooperative, Ex and graph
 * launch passes through vgpu_limiter_before_launch():
 *
 * 1. Measure. Two events bracket each launch on its stream (before_launch / after_launch);
 *    their elapsed GPU time is what that launch occupied the stream: its start is when the work
 *    queued before it finished (or when it was launched, on an idle stream), its end when it
 *    finished. CPU time between launches and idle gaps are never charged.
 * 2. Budget. A token bucket per device fills at pct% of wall time (capped at BURST_NS) and is
 *    drained by the measured launches, harvested at most every HARVEST_NS.
 * 3. Throttle. In debt, the launching thread sleeps until the bucket is back at zero, holding
 *    the device's launch lock so that other launching threads wait too (the debt is paid once). The
 *    ring of RING event pairs bounds how far the CPU may run ahead of the GPU.
 *
 * Over any few hundred milliseconds the process gets pct% of the device's time, so a
 * compute-bound loop runs at pct% of its unthrottled throughput (tests/region/test_limiter.py
 * over a simulated GPU, tests/gpu/test_region_gpu.py on a real one). Launches on concurrent
 * streams are each charged in full (conservative).
 *
 * Policy: GPU_CORE_UTILIZATION_POLICY=force always throttles, =disable never; otherwise we follow
 * the monitor's utilization_switch in the region (it lifts throttling when the GPU is not
 * contended). The region's sm_limit wins over this process's env (region.c warns on a mismatch).
 * While throttling we stamp recent_kernel/last_kernel_time for the monitor's priority logic and
 * report the measured share of GPU time in our slot's device_util[dev].sm_util. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "log/log.h"
#include "region/region.h"

#define RING 64
#define HARVEST_NS 2000000ll     /* 2 ms between harvests */
#define BURST_NS 20000000ll      /* at most 20 ms of GPU time banked */
#define MAX_SLEEP_NS 500000000ll /* one sleep never exceeds 0.5 s (the debt carries over) */
#define RECENT_KERNEL_MARK 2     /* "launched recently", decayed by the monitor */

VGPU_HIDDEN int vgpu_limiter_enabled = 0;

struct pair {
    CUevent start, end;
    int done; /* end recorded: the pair can be harvested once `end` completes */
};

struct dev_state {
    pthread_mutex_t throttle_mu; /* launching threads of this device, one at a time */
    pthread_mutex_t mu;          /* the ring and the bucket */
    CUcontext ctx; /* the context our events belong to */
    struct pair ring[RING];
    int ready;             /* events created */
    unsigned head, tail;   /* pairs in flight are [tail, head) */
    long long tokens_ns;
    long long last_refill_ns;
    long long next_harvest_ns;
    long long last_stamp_s;
    long long charged_ns;  /* GPU time harvested since the last utilisation report */
    long long window_start_ns;
};

static struct dev_state dev_state[VGPU_MAX_DEVICES];
static int env_percent[VGPU_MAX_DEVICES];
static int policy;
static vgpu_limiter_ops_t ops;
static int ops_state; /* 0 unknown, 1 loaded, -1 missing */
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
/* the pair this thread opened in before_launch, closed by after_launch; -1 none */
static __thread int open_dev = -1;
static __thread unsigned open_slot;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

VGPU_HIDDEN void vgpu_limiter_load_env(void)
{
    const char *pol = getenv("GPU_CORE_UTILIZATION_POLICY");
    int any = 0, d;

    policy = VGPU_POLICY_DEFAULT;
    if (pol && !strcasecmp(pol, "force"))
        policy = VGPU_POLICY_FORCE;
    else if (pol && !strcasecmp(pol, "disable"))
        policy = VGPU_POLICY_DISABLE;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        env_percent[d] = (int)vgpu_env_sm_limit(d);
        any |= env_percent[d] > 0;
    }
    __atomic_store_n(&vgpu_limiter_enabled, any && policy != VGPU_POLICY_DISABLE, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void limiter_ctor(void)
{
    vgpu_limiter_load_env(); /* env only: no driver, no thread */
}

VGPU_HIDDEN int vgpu_limiter_percent(int dev)
{
    vgpu_region_t *r = vgpu_region_get();
    long long pct;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || policy == VGPU_POLICY_DISABLE)
        return 0;
    pct = r ? (long long)__atomic_load_n(&r->sm_limit[dev], __ATOMIC_RELAXED) : env_percent[dev];
    if (pct <= 0 || pct >= 100)
        return 0;
    if (policy == VGPU_POLICY_DEFAULT && r && !__atomic_load_n(&r->utilization_switch, __ATOMIC_RELAXED))
        return 0; /* the monitor says the device is not contended */
    return (int)pct;
}

static void init_states(void)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        pthread_mutex_init(&dev_state[d].throttle_mu, 0);
        pthread_mutex_init(&dev_state[d].mu, 0);
    }
}

static int load_ops(void)
{
    int s = __atomic_load_n(&ops_state, __ATOMIC_ACQUIRE);
    if (s)
        return s > 0;
    s = vgpu_limiter_ops_load(&ops) == 0 ? 1 : -1;
    if (s < 0)
        VGPU_WARN("SM limit set but the driver lacks the event entry points; launches are not throttled");
    __atomic_store_n(&ops_state, s, __ATOMIC_RELEASE);
    return s > 0;
}

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
    st->ctx = cur;
    st->ready = 1;
    st->last_refill_ns = st->window_start_ns = now_ns();
    st->tokens_ns = BURST_NS;
    return 1;
}

static void refill(struct dev_state *st, int pct, long long now)
{
    st->tokens_ns += (now - st->last_refill_ns) * pct / 100;
    st->last_refill_ns = now;
    if (st->tokens_ns > BURST_NS)
        st->tokens_ns = BURST_NS;
}

/* charge every launch whose end event has completed, oldest first */
static void harvest(struct dev_state *st)
{
    while (st->tail != st->head) {
        struct pair *p = &st->ring[st->tail % RING];
        float ms = 0;

        if (!p->done || ops.event_query(p->end) != CUDA_SUCCESS)
            break;
        if (ops.event_elapsed(&ms, p->start, p->end) != CUDA_SUCCESS || ms < 0)
            ms = 0;
        st->tokens_ns -= (long long)((double)ms * 1e6);
        st->charged_ns += (long long)((double)ms * 1e6);
        p->done = 0;
        st->tail++;
    }
}

/* once a second: the monitor's kernel stamps, and our measured SM share in our slot's sm_util */
static void stamp_region(struct dev_state *st, int dev, long long now)
{
    vgpu_region_t *r = vgpu_region_get();
    vgpu_proc_slot_t *me;
    long long s = now / 1000000000ll, window = now - st->window_start_ns, util;

    if (!r || s == st->last_stamp_s)
        return;
    st->last_stamp_s = s;
    __atomic_store_n(&r->recent_kernel, RECENT_KERNEL_MARK, __ATOMIC_RELAXED);
    __atomic_store_n(&r->last_kernel_time, (uint64_t)time(0), __ATOMIC_RELAXED);
    me = vgpu_region_self();
    if (me && window > 0) {
        util = st->charged_ns * 100 / window;
        __atomic_store_n(&me->device_util[dev].sm_util, (uint64_t)(util > 100 ? 100 : util), __ATOMIC_RELAXED);
    }
    st->charged_ns = 0;
    st->window_start_ns = now;
}

/* mu held: bring the bucket up to date; returns how long to sleep to pay the debt (0: none) */
static long long account(struct dev_state *st, int dev, int pct)
{
    long long now = now_ns(), debt;

    refill(st, pct, now);
    harvest(st);
    stamp_region(st, dev, now);
    st->next_harvest_ns = now + HARVEST_NS;
    if (st->tokens_ns >= 0)
        return 0;
    debt = -st->tokens_ns * 100 / pct; /* wall time that refills the bucket to zero */
    return debt > MAX_SLEEP_NS ? MAX_SLEEP_NS : debt;
}

static void sleep_ns(long long ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000ll);
    ts.tv_nsec = (long)(ns % 1000000000ll);
    nanosleep(&ts, 0);
}

/* throttle_mu held (launching threads queue here while one pays the debt); mu taken only for
 * short bookkeeping so that after_launch of other threads never waits for a sleep */
static void do_before(struct dev_state *st, int dev, int pct, CUstream stream)
{
    long long debt = 0;
    CUevent wait_for = 0;
    struct pair *p;

    pthread_mutex_lock(&st->mu);
    if (!ensure_events(st)) {
        pthread_mutex_unlock(&st->mu);
        return;
    }
    if (now_ns() >= st->next_harvest_ns)
        debt = account(st, dev, pct);
    if (st->head - st->tail == RING) { /* CPU too far ahead: wait for the oldest launch */
        p = &st->ring[st->tail % RING];
        if (!p->done) { /* another thread is between its before and after: leave this one unmeasured */
            pthread_mutex_unlock(&st->mu);
            return;
        }
        wait_for = p->end;
    }
    pthread_mutex_unlock(&st->mu);
    if (wait_for)
        ops.event_sync(wait_for);
    if (debt)
        sleep_ns(debt);
    pthread_mutex_lock(&st->mu);
    if (wait_for || debt) {
        refill(st, pct, now_ns());
        harvest(st);
    }
    if (st->head - st->tail < RING) {
        p = &st->ring[st->head % RING];
        if (ops.event_record(p->start, stream) == CUDA_SUCCESS) { /* else another context's stream */
            p->done = 0;
            open_dev = dev;
            open_slot = st->head++;
        }
    }
    pthread_mutex_unlock(&st->mu);
}

VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream stream)
{
    CUdevice dev = -1;
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    struct dev_state *st;
    int pct;

    open_dev = -1;
    if (!load_ops() || ops.ctx_get_device(&dev) != CUDA_SUCCESS || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return;
    pct = vgpu_limiter_percent(dev);
    if (!pct)
        return;
    /* recording into a capturing stream would add nodes to the user's graph: the graph's launch
     * is throttled instead */
    if (ops.stream_is_capturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    pthread_once(&state_once, init_states);
    st = &dev_state[dev];
    pthread_mutex_lock(&st->throttle_mu);
    do_before(st, dev, pct, stream);
    pthread_mutex_unlock(&st->throttle_mu);
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
