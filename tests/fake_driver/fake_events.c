/* Optional event entry points for the fake libcuda.so.1 (linked in only by the limiter cost
 * tests and bench/limiter_launch.py: the plain fake driver has none, so the limiter stays off).
 * Kernels take no time here: an event completes when it is recorded and two events are 0 ms
 * apart (so the limiter measures, but never throttles: its own cost is what is left); every call is counted:
 * fake_event_calls("cuEventRecord"), fake_event_calls("*") for all of them. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    ECOUNT(cuEventCreate);
    *e = calloc(1, sizeof **e);
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    (void)s;
    ECOUNT(cuEventRecord);
    e->ns = now_ns();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    (void)e;
    ECOUNT(cuEventQuery);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    (void)e;
    ECOUNT(cuEventSynchronize);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    ECOUNT(cuEventElapsedTime);
    (void)a, (void)b;
    *ms = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    ECOUNT(cuEventElapsedTime_v2);
    (void)a, (void)b;
    *ms = 0;
    return CUDA_SUCCESS;
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
