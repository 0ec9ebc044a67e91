/* Optional event entry points for the fake libcuda.so.1 (linked in only by the limiter cost
 * tests and bench/limiter_launch.py: the plain fake driver has none, so the limiter stays off).
 * Kernels take no time here: an event completes when it is recorded and two events are 0 ms
 * apart (so the limiter measures, but never throttles: its own cost is what is left); every call is counted:
 * fake_event_calls("cuEventRecord"), fake_event_calls("*") for all of them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_gpu.h"

#include <cuda.h>
#undef cuEventElapsedTime /* cuda.h maps it to _v2 (CUDA 13); the fake has both spellings */
#undef cuEventDestroy

/* weak: where fake_cuda.c defines one of these itself, its definition wins (no duplicate symbol) */
#define EXPORT __attribute__((visibility("default"), weak))

#define EV_COUNTED(X) \
    X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) \
    X(cuEventElapsedTime_v2) X(cuEventDestroy_v2) X(cuStreamIsCapturing)

enum {
#define X(n) E_##n,
    EV_COUNTED(X)
#undef X
    NEV
};
static const char *const ev_name[] = {
#define X(n) #n,
    EV_COUNTED(X)
#undef X
};
static unsigned long ev_counts[NEV];
#define ECOUNT(n) __atomic_fetch_add(&ev_counts[E_##n], 1, __ATOMIC_RELAXED)

EXPORT unsigned long fake_event_calls(const char *name)
{
    unsigned long sum = 0; /* "*" (all of them) or one name; 0 for a name not counted here */
    for (int i = 0; i < NEV; i++) {
        if (!strcmp(name, "*"))
            sum += __atomic_load_n(&ev_counts[i], __ATOMIC_RELAXED);
        else if (!strcmp(ev_name[i], name))
            return __atomic_load_n(&ev_counts[i], __ATOMIC_RELAXED);
    }
    return sum;
}

struct CUevent_st {
    long long ns;
    int slot; /* its row in the shared GPU's event table */
};

static long long kernel_ns = 1000000;
static long long kernel_blocks; /* FAKE_KERNEL_BLOCKS: a kernel of this many blocks takes kernel_ns, others in
                                 * proportion (at least 1 us); 0: every kernel takes kernel_ns */
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static int next_slot;

static void gpu_init(void)
{
    const char *path = getenv("FAKE_GPU"), *us = getenv("FAKE_KERNEL_US");
    if (us)
        kernel_ns = atoll(us) * 1000;
    if (getenv("FAKE_KERNEL_BLOCKS"))
        kernel_blocks = atoll(getenv("FAKE_KERNEL_BLOCKS"));
    if (path && *path)
        gpu_open(path, 0);
}

static int gpu_on(void)
{
    pthread_once(&gpu_once, gpu_init);
    return shared != 0;
}

EXPORT void fake_gpu_launch(unsigned long long blocks)
{
    long long ns = kernel_ns;

    if (!gpu_on())
        return;
    if (kernel_blocks > 0) {
        ns = (long long)((double)kernel_ns * (double)blocks / (double)kernel_blocks);
        ns = ns < 1000 ? 1000 : ns;
    }
    lock();
    advance(now_ns());
    me->queued += ns;
    me->submitted += ns;
    unlock();
}

EXPORT void fake_gpu_drain(void)
{
    if (gpu_on())
        drain();
}

/* when the event completed, 0 if not yet (shared GPU only) */
static long long gpu_event_done(CUevent e)
{
    long long ts;
    lock();
    advance(now_ns());
    ts = me->ev[e->slot].ts;
    unlock();
    return ts;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    ECOUNT(cuEventCreate);
    *e = calloc(1, sizeof **e);
    if (*e)
        (*e)->slot = __atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED) % SIM_EVENTS;
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    (void)s;
    ECOUNT(cuEventRecord);
    e->ns = now_ns();
    if (gpu_on()) {
        lock();
        advance(now_ns());
        sim_record(e->slot, now_ns());
        unlock();
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    ECOUNT(cuEventQuery);
    return !gpu_on() || gpu_event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    struct timespec nap = {0, 100000};
    ECOUNT(cuEventSynchronize);
    while (gpu_on() && !gpu_event_done(e))
        nanosleep(&nap, 0);
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    long long ta, tb;
    *ms = 0;
    if (!gpu_on())
        return CUDA_SUCCESS;
    if (!(ta = gpu_event_done(a)) || !(tb = gpu_event_done(b)))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(tb - ta) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    ECOUNT(cuEventElapsedTime);
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    ECOUNT(cuEventElapsedTime_v2);
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    ECOUNT(cuEventDestroy_v2);
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    (void)s;
    ECOUNT(cuStreamIsCapturing);
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
