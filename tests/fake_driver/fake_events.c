/* Optional event entry points for the fake libcuda.so.1 (linked in only by the limiter cost
 * tests and bench/limiter_launch.py: the plain fake driver has none, so the limiter stays off).
 * Without FAKE_GPU kernels take no time: an event completes when it is recorded and two events are 0 ms
 * apart (so the limiter measures, but never throttles: its own cost is what is left); every call is counted:
 * fake_event_calls("cuEventRecord"), fake_event_calls("*") for all of them.
 * With FAKE_GPU=FILE kernels take time on a GPU every process naming FILE shares (sim_gpu.h):
 *   FAKE_KERNEL_US=N      a kernel takes N us (1000 by default)
 *   FAKE_KERNEL_BLOCKS=B  a kernel of B blocks takes FAKE_KERNEL_US, others in proportion
 *   FAKE_SM_MODEL=1       kernels hold SMs (sim_gpu.h's sms): one of B blocks holds min(B, SMs x blocks an
 *                         SM holds of its shape) of the GPU's block slots and takes FAKE_KERNEL_US per wave
 *                         of that many (FAKE_KERNEL_BLOCKS is not read); one process's kernels on different
 *                         streams run together while they fit. Unset, every kernel holds the whole GPU. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_gpu.h"
#include "sm.h"

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
static int sm_model; /* FAKE_SM_MODEL=1 */
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static int next_slot;

static void gpu_init(void)
{
    const char *path = getenv("FAKE_GPU"), *us = getenv("FAKE_KERNEL_US");
    if (us)
        kernel_ns = atoll(us) * 1000;
    if (getenv("FAKE_KERNEL_BLOCKS"))
        kernel_blocks = atoll(getenv("FAKE_KERNEL_BLOCKS"));
    sm_model = getenv("FAKE_SM_MODEL") && !strcmp(getenv("FAKE_SM_MODEL"), "1");
    if (path && *path)
        gpu_open(path, 0);
}

static int gpu_on(void)
{
    pthread_once(&gpu_once, gpu_init);
    return shared != 0;
}

/* FAKE_SM_MODEL: the SMs a kernel's grid holds and its waves (see the top); lock held, after advance */
static void launch_on_sms(unsigned long long blocks, unsigned long long threads, unsigned smem, CUstream s)
{
    int per_sm = threads >= 1 && threads <= 1024 ? fake_blocks_per_sm((int)threads, smem) : 0;
    /* the blocks the GPU holds at once; a shape no SM holds (the fake launches it all the same) counts one */
    unsigned long long slots = FAKE_SMS * (unsigned long long)(per_sm > 0 ? per_sm : 1);
    unsigned long long b = blocks ? blocks : 1, held = b < slots ? b : slots;
    long long waves = (long long)((b + slots - 1) / slots);
    /* the default stream, however it is named, is one stream */
    unsigned long long stream = s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ? 0 : (uintptr_t)s;

    /* its share rounded up, as the shim's occupancy charge rounds it (c_src/limiter/occupancy.c) */
    sim_launch(stream, waves * kernel_ns, (long long)((held * SIM_PPM + slots - 1) / slots));
}

EXPORT void fake_gpu_launch(unsigned long long blocks, unsigned long long threads, unsigned smem, CUstream s)
{
    long long ns = kernel_ns;

    if (!gpu_on())
        return;
    if (sm_model) {
        lock();
        advance(now_ns());
        launch_on_sms(blocks, threads, smem, s);
        unlock();
        return;
    }
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
