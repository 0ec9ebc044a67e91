/* === LIMITER: the SM (compute) limiter, CUDA_DEVICE_SM_LIMIT[_<i>] percent of GPU time.
 *
 * No thread, and nothing at all on launches when no SM limit is set: vgpu_limiter_enabled stays 0
 * and the launch wrappers only test it. With a limit, every kernel, cooperative, Ex and graph
 * launch passes through vgpu_limiter_before_launch():
 *
 * 1. Measure. An event is recorded on the launch's stream before each launch; the GPU time
 *    between consecutive events is the time the previous launch occupied the stream. When the
 *    previous event had not completed yet at record time, the stream had queued work, so the
 *    next event fires exactly when that launch ends: the segment is exact. Otherwise the stream
 *    may have gone idle (the app was computing on the CPU, or synchronised), so the segment is
 *    capped at AMBIGUOUS_CAP_NS and an idle gap is not charged as GPU time.
 * 2. Budget. A token bucket per device fills at pct% of wall time (capped at BURST_NS) and is
 *    drained by the measured segments, harvested at most every HARVEST_NS.
 * 3. Throttle. In debt, the launching thread sleeps until the bucket is back at zero, holding
 *    the device's lock so that other launching threads wait too (the debt is paid once). The
 *    ring of RING events bounds how far the CPU may run ahead of the GPU.
 *
 * Over any few hundred milliseconds the process gets pct% of the device's time: a compute-bound
 * loop runs at pct% of its unthrottled throughput (bench/region_sm_limit.py, tests/gpu). Known
 * limit: a synchronised loop of kernels longer than AMBIGUOUS_CAP_NS is under-charged.
 *
 * Policy: GPU_CORE_UTILIZATION_POLICY=force always throttles, =disable never; otherwise we follow
 * the monitor's utilization_switch in the region (it lifts throttling when the GPU is not
 * contended). The region's sm_limit wins over this process's env (region.c warns on a mismatch).
 * While throttling we stamp recent_kernel/last_kernel_time for the monitor's priority logic. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "log/log.h"
#include "region/region.h"

#define RING 64
#define HARVEST_NS 2000000ll        /* 2 ms between harvests */
#define BURST_NS 20000000ll         /* at most 20 ms of GPU time banked */
#define AMBIGUOUS_CAP_NS 50000000ll /* 50 ms: longest segment charged when the stream may have idled */
#define MAX_SLEEP_NS 500000000ll    /* one sleep never exceeds 0.5 s (the debt carries over) */
#define RECENT_KERNEL_MARK 2        /* "launched recently", decayed by the monitor */

VGPU_HIDDEN int vgpu_limiter_enabled = 0;

struct dev_state {
    pthread_mutex_t mu;
    CUcontext ctx; /* the context our events belong to */
    CUevent ev[RING];
    unsigned char ambiguous[RING]; /* segment starting at ev[i] may include idle time */
    int ready;                     /* events created */
    unsigned head, tail;           /* outstanding events are [tail, head) */
    long long tokens_ns;
    long long last_refill_ns;
    long long next_harvest_ns;
    long long last_stamp_s;
};

static struct dev_state dev_state[VGPU_MAX_DEVICES];
static int env_percent[VGPU_MAX_DEVICES];
static int policy;
static vgpu_limiter_ops_t ops;
static int ops_state; /* 0 unknown, 1 loaded, -1 missing */
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

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
    for (d = 0; d < VGPU_MAX_DEVICES; d++)
        pthread_mutex_init(&dev_state[d].mu, 0);
}

static int load_ops(void)
{
    int s = __atomic_load_n(&ops_state, __ATOMIC_ACQUIRE);
    if (s)
        return s > 0;
    s = vgpu_limiter_ops_load(&ops) == 0 ? 1 : -1;
    if (s < 0)
        VGPU_WARN("SM limit set but the driver lacks event entry points; launches are not throttled");
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
        if (ops.event_create(&st->ev[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS)
            return 0; /* created ones are kept for the next try */
    st->ctx = cur;
    st->ready = 1;
    st->head = st->tail = 0;
    st->last_refill_ns = now_ns();
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

/* charge every segment whose end event has completed */
static void harvest(struct dev_state *st)
{
    while (st->head - st->tail >= 2) {
        unsigned a = st->tail % RING, b = (st->tail + 1) % RING;
        float ms = 0;
        long long seg;

        if (ops.event_query(st->ev[b]) != CUDA_SUCCESS)
            break;
        if (ops.event_elapsed(&ms, st->ev[a], st->ev[b]) != CUDA_SUCCESS || ms < 0)
            ms = 0;
        seg = (long long)((double)ms * 1e6);
        if (st->ambiguous[a] && seg > AMBIGUOUS_CAP_NS)
            seg = AMBIGUOUS_CAP_NS;
        st->tokens_ns -= seg;
        st->tail++;
    }
}

static void stamp_region(struct dev_state *st, long long now)
{
    vgpu_region_t *r = vgpu_region_get();
    long long s = now / 1000000000ll;

    if (!r || s == st->last_stamp_s)
        return; /* once a second is all the monitor's period needs */
    st->last_stamp_s = s;
    __atomic_store_n(&r->recent_kernel, RECENT_KERNEL_MARK, __ATOMIC_RELAXED);
    __atomic_store_n(&r->last_kernel_time, (uint64_t)time(0), __ATOMIC_RELAXED);
}

static void throttle(struct dev_state *st, int pct)
{
    long long now = now_ns(), debt;
    struct timespec ts;

    refill(st, pct, now);
    harvest(st);
    stamp_region(st, now);
    st->next_harvest_ns = now + HARVEST_NS;
    if (st->tokens_ns >= 0)
        return;
    debt = -st->tokens_ns * 100 / pct; /* wall time that refills the bucket to zero */
    if (getenv("DBG")) fprintf(stderr, "tokens %lld debt %lld head %u tail %u\n", st->tokens_ns, debt, st->head, st->tail);
    if (debt > MAX_SLEEP_NS)
        debt = MAX_SLEEP_NS;
    ts.tv_sec = (time_t)(debt / 1000000000ll);
    ts.tv_nsec = (long)(debt % 1000000000ll);
    nanosleep(&ts, 0);
    refill(st, pct, now_ns());
}

static void do_before_launch(struct dev_state *st, int pct, CUstream stream)
{
    unsigned slot;

    if (!ensure_events(st))
        return;
    if (st->head - st->tail == RING) { /* CPU too far ahead: wait for the oldest segment */
        ops.event_sync(st->ev[(st->tail + 1) % RING]);
        refill(st, pct, now_ns());
        harvest(st);
    }
    slot = st->head % RING;
    if (st->head != st->tail) {
        unsigned prev = (st->head - 1) % RING;
        st->ambiguous[prev] = ops.event_query(st->ev[prev]) == CUDA_SUCCESS;
    }
    if (ops.event_record(st->ev[slot], stream) != CUDA_SUCCESS)
        return; /* a stream of another context: not measured */
    st->head++;
    if (now_ns() >= st->next_harvest_ns)
        throttle(st, pct);
}

VGPU_HIDDEN void vgpu_limiter_before_launch(CUstream stream)
{
    CUdevice dev = -1;
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    struct dev_state *st;
    int pct;

    if (!load_ops() || ops.ctx_get_device(&dev) != CUDA_SUCCESS || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return;
    pct = vgpu_limiter_percent(dev);
    if (!pct)
        return;
    /* recording into a capturing stream would add a node to the user's graph: the graph's launch
     * is throttled instead */
    if (ops.stream_is_capturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    pthread_once(&state_once, init_states);
    st = &dev_state[dev];
    pthread_mutex_lock(&st->mu);
    do_before_launch(st, pct, stream);
    pthread_mutex_unlock(&st->mu);
}
