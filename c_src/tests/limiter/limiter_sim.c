/* The SM limiter over a simulated GPU (not part of the shim). One stream: a launched kernel starts
 * when the stream is free and runs for its duration; an event completes when the work queued
 * before it has. Runs a kernel loop through vgpu_limiter_before_launch() and prints its wall time.
 *   limiter_sim MODE KERNEL_US COUNT      MODE: async (sync every 32 launches) | sync (after each)
 *                                               | sparse (sync, then 4x the kernel time on the CPU)
 * Prints: enabled=<0|1> wall_ms=<float> gpu_ms=<float>
 * With VGPU_SIM_REGION=1 it first attaches the shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE),
 * so the region's sm_limit and the monitor's utilization_switch apply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

static long long gpu_free_at; /* ns, CLOCK_MONOTONIC */
static long long ev_ts[1024];
static int nev;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void sleep_until(long long t)
{
    long long d = t - now_ns();
    if (d > 0) {
        struct timespec ts = {(time_t)(d / 1000000000ll), (long)(d % 1000000000ll)};
        nanosleep(&ts, 0);
    }
}

static long long max_ll(long long a, long long b)
{
    return a > b ? a : b;
}

static CUresult get_device(CUdevice *d)
{
    *d = 0;
    return CUDA_SUCCESS;
}
static CUresult get_current(CUcontext *c)
{
    *c = (CUcontext)1;
    return CUDA_SUCCESS;
}
static CUresult ev_create(CUevent *e, unsigned int f)
{
    (void)f;
    if (nev >= 1024)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (CUevent)(long)(nev++ + 1);
    return CUDA_SUCCESS;
}
static long long *ts_of(CUevent e)
{
    return &ev_ts[(long)e - 1];
}
static CUresult ev_record(CUevent e, CUstream s)
{
    (void)s;
    *ts_of(e) = max_ll(now_ns(), gpu_free_at);
    return CUDA_SUCCESS;
}
static CUresult ev_query(CUevent e)
{
    return now_ns() >= *ts_of(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult ev_sync(CUevent e)
{
    sleep_until(*ts_of(e));
    return CUDA_SUCCESS;
}
static CUresult ev_elapsed(float *ms, CUevent a, CUevent b)
{
    if (ev_query(a) || ev_query(b))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(*ts_of(b) - *ts_of(a)) / 1e6);
    return CUDA_SUCCESS;
}
static CUresult capturing(CUstream s, CUstreamCaptureStatus *st)
{
    (void)s;
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

static CUresult count(int *n)
{
    *n = 1;
    return CUDA_SUCCESS;
}

VGPU_HIDDEN int vgpu_limiter_ops_load(vgpu_limiter_ops_t *ops)
{
    ops->device_count = count;
    ops->ctx_get_device = get_device;
    ops->ctx_get_current = get_current;
    ops->event_create = ev_create;
    ops->event_record = ev_record;
    ops->event_query = ev_query;
    ops->event_sync = ev_sync;
    ops->event_elapsed = ev_elapsed;
    ops->stream_is_capturing = capturing;
    return 0;
}

int main(int argc, char **argv)
{
    long long k_ns, t0, gpu_ns;
    int i, n;
    const char *mode;

    if (argc != 4)
        return 2;
    vgpu_log_init_from_env();
    if (getenv("VGPU_SIM_REGION")) {
        vgpu_region_config_t cfg;
        memset(&cfg, 0, sizeof cfg);
        vgpu_limits_load_env();
        vgpu_region_config_from_env(&cfg);
        cfg.device_count = 1;
        if (vgpu_region_attach(0, &cfg) != 0)
            return 3;
    }
    mode = argv[1];
    k_ns = atoll(argv[2]) * 1000;
    n = atoi(argv[3]);
    gpu_ns = k_ns * n;
    t0 = now_ns();
    gpu_free_at = t0;
    for (i = 0; i < n; i++) {
        if (__builtin_expect(vgpu_limiter_enabled, 0)) /* exactly what the launch wrappers do */
            vgpu_limiter_before_launch((CUstream)0, 0);
        gpu_free_at = max_ll(now_ns(), gpu_free_at) + k_ns; /* the launch */
        if (__builtin_expect(vgpu_limiter_enabled, 0))
            vgpu_limiter_after_launch((CUstream)0);
        if (!strcmp(mode, "sync") || !strcmp(mode, "sparse") || (i % 32 == 31))
            sleep_until(gpu_free_at);
        if (!strcmp(mode, "sparse"))
            sleep_until(now_ns() + 4 * k_ns);
    }
    sleep_until(gpu_free_at);
    printf("enabled=%d wall_ms=%.3f gpu_ms=%.3f\n", vgpu_limiter_throttles(), (double)(now_ns() - t0) / 1e6,
           (double)gpu_ns / 1e6);
    return 0;
}
