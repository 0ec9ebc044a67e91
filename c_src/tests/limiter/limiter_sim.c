/* The SM limiter over a simulated GPU (not part of the shim). Runs a kernel loop through
 * vgpu_limiter_before_launch() exactly as the launch wrappers do and prints its wall time.
 *   limiter_sim MODE KERNEL_US COUNT      MODE: async (sync every SIM_SYNC_EVERY launches, 32 by
 *                                               default) | sync (after each)
 *                                               | sparse (sync, then 4x the kernel time on the CPU)
 * Prints: enabled=<0|1> wall_ms=<float> gpu_ms=<float> kernels=<n>
 * SIM_SECONDS=S runs for S seconds instead of COUNT kernels (kernels= says how many ran).
 *   limiter_sim observe FROM TO           with SIM_GPU: each process's GPU work done within [FROM, TO]
 *                                         (CLOCK_MONOTONIC seconds), read from the GPU itself as NVML would
 *                                         be from outside: one `pid=<pid> gpu_ms=<float>` line each
 * With VGPU_SIM_REGION=1 it first attaches the shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE),
 * so the region's sm_limit, its compute ledger and the monitor's utilization_switch apply;
 * VGPU_SIM_REGION=find only prints which region file it would attach (found=).
 *
 * The GPU. Alone, one stream: a kernel starts when the stream is free and runs for its duration.
 * With SIM_GPU=FILE, one GPU shared by every process that names the same file, time-slicing as an H200
 * does (tests/fake_driver/sim_gpu.h); SIM_GPU_MODE=slice (default) or serial picks the regime. An
 * event recorded before a launch (the limiter's start event) completes when that kernel starts; one
 * recorded after it, when the stream's work so far is done. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "limiter/limiter.h"
#include "limiter/limiter_int.h"
#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"
#include "../../../tests/fake_driver/sim_gpu.h" /* the GPU model, shared with the fake driver */

static long long own_free_at; /* alone: our stream's end */
static long long local_ts[SIM_EVENTS];
static int nev, in_before, pending = -1;

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

/* serial: our stream's end */
static long long *stream_end(void)
{
    return shared ? &me->q_end : &own_free_at;
}

/* the launch of a kernel of k_ns; returns when it starts on the GPU (serial and alone) */
static long long gpu_launch(long long k_ns)
{
    long long t = now_ns(), start = max_ll(t, *stream_end()), end, seen;

    if (!shared) {
        own_free_at = start + k_ns;
        return start;
    }
    if (!serial) {
        lock();
        advance(t);
        me->queued += k_ns;
        me->submitted += k_ns;
        unlock();
        return 0;
    }
    seen = __atomic_load_n(&shared->gpu_free, __ATOMIC_RELAXED);
    do {
        start = max_ll(max_ll(t, me->q_end), seen);
        end = start + k_ns;
    } while (!__atomic_compare_exchange_n(&shared->gpu_free, &seen, end, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    __atomic_store_n(&me->q_end, end, __ATOMIC_RELEASE);
    return start;
}

static void do_drain(void);

/* wait until everything this process launched is done, as cuCtxSynchronize does under the shim */
static void gpu_drain(void)
{
    int held = __builtin_expect(vgpu_limiter_enabled, 0) ? vgpu_limiter_before_wait() : -1;
    do_drain();
    if (held >= 0)
        vgpu_limiter_after_wait(held);
}

static void do_drain(void)
{
    if (!shared || serial)
        sleep_until(*stream_end());
    else
        drain();
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
    if (nev >= SIM_EVENTS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (CUevent)(long)(nev++ + 1);
    return CUDA_SUCCESS;
}
static int ev_index(CUevent e)
{
    return (int)((long)e - 1);
}
/* when the event completed, 0 if not yet */
static long long ev_done_at(CUevent e)
{
    long long ts;
    int i = ev_index(e);

    if (!shared || serial)
        return now_ns() >= local_ts[i] ? local_ts[i] : 0;
    lock();
    advance(now_ns());
    ts = me->ev[i].ts;
    unlock();
    return ts;
}
static CUresult ev_record(CUevent e, CUstream s)
{
    int i = ev_index(e);
    (void)s;
    if (shared && !serial) {
        lock();
        advance(now_ns());
        sim_record(i, now_ns());
        unlock();
        return CUDA_SUCCESS;
    }
    local_ts[i] = max_ll(now_ns(), *stream_end());
    if (in_before)
        pending = i; /* the kernel launched next says when it starts */
    return CUDA_SUCCESS;
}
static CUresult ev_query(CUevent e)
{
    return ev_done_at(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult ev_sync(CUevent e)
{
    while (!ev_done_at(e))
        sleep_until(now_ns() + 100000);
    return CUDA_SUCCESS;
}
static CUresult ev_elapsed(float *ms, CUevent a, CUevent b)
{
    long long ta = ev_done_at(a), tb = ev_done_at(b);
    if (!ta || !tb)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(tb - ta) / 1e6);
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

static int key(int ordinal, char *out, size_t n)
{
    snprintf(out, n, "GPU-sim-%d", ordinal);
    return 0;
}

/* the GPU's own count of its processes, as NVML would give it; SIM_GPU_PROCS=self: an NVML that lists only the
 * caller (one that filtered by pid namespace would) */
static int procs(int ordinal)
{
    int i, n = 0;
    (void)ordinal;
    if (!shared || (getenv("SIM_GPU_PROCS") && !strcmp(getenv("SIM_GPU_PROCS"), "self")))
        return 1;
    for (i = 0; i < SIM_PROCS; i++) { /* a process that died has no context left (its row stays) */
        int pid = __atomic_load_n(&shared->proc[i].pid, __ATOMIC_RELAXED);
        n += pid && (kill(pid, 0) == 0 || errno == EPERM);
    }
    return n;
}

/* the GPU's utilisation, as NVML would give it (over about its sample period); SIM_GPU_UTIL=none: NVML
 * has none */
static int util(int ordinal)
{
    long long ppm;
    (void)ordinal;
    if (!shared || serial || (getenv("SIM_GPU_UTIL") && !strcmp(getenv("SIM_GPU_UTIL"), "none")))
        return -1;
    lock();
    advance(now_ns());
    ppm = shared->util_ppm;
    unlock();
    return (int)(ppm / 10000);
}

VGPU_HIDDEN int vgpu_limiter_ops_load(vgpu_limiter_ops_t *ops)
{
    ops->gpu_procs = procs;
    ops->gpu_util = util;
    ops->device_count = count;
    ops->device_key = key;
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

/* the work each process had done at `at` (the observer holds no row of its own) */
static void done_at(long long at, int *pids, long long *done)
{
    int i;

    sleep_until(at);
    lock();
    advance(now_ns());
    for (i = 0; i < SIM_PROCS; i++) {
        pids[i] = shared->proc[i].pid;
        done[i] = shared->proc[i].done;
    }
    unlock();
}

static int observe(const char *gpu, double from, double to)
{
    int pids0[SIM_PROCS], pids1[SIM_PROCS], i;
    long long done0[SIM_PROCS], done1[SIM_PROCS];

    gpu_fd = open(gpu, O_RDWR | O_CLOEXEC);
    if (gpu_fd < 0)
        return 4;
    shared = mmap(0, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED, gpu_fd, 0);
    if (shared == MAP_FAILED)
        return 4;
    done_at((long long)(from * 1e9), pids0, done0);
    done_at((long long)(to * 1e9), pids1, done1);
    for (i = 0; i < SIM_PROCS; i++)
        if (pids0[i] && pids0[i] == pids1[i])
            printf("pid=%d gpu_ms=%.3f\n", pids0[i], (double)(done1[i] - done0[i]) / 1e6);
    return 0;
}

int main(int argc, char **argv)
{
    long long k_ns, t0, start, stop = 0;
    int i, n, sync_every = 32;
    const char *mode, *gpu = getenv("SIM_GPU"), *secs = getenv("SIM_SECONDS");

    if (argc == 4 && !strcmp(argv[1], "observe") && gpu)
        return observe(gpu, atof(argv[2]), atof(argv[3]));
    if (argc != 4)
        return 2;
    vgpu_log_init_from_env();
    if (gpu && *gpu)
        gpu_open(gpu, getenv("SIM_GPU_MODE") && !strcmp(getenv("SIM_GPU_MODE"), "serial"));
    if (getenv("VGPU_SIM_REGION") && !strcmp(getenv("VGPU_SIM_REGION"), "find")) {
        char found[4096];
        vgpu_region_choose_path(found, sizeof found);
        printf("found=%s\n", found);
        return 0;
    }
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
    if (getenv("SIM_SYNC_EVERY") && atoi(getenv("SIM_SYNC_EVERY")) > 0)
        sync_every = atoi(getenv("SIM_SYNC_EVERY"));
    k_ns = atoll(argv[2]) * 1000;
    n = atoi(argv[3]);
    t0 = now_ns();
    if (secs)
        stop = t0 + (long long)(atof(secs) * 1e9);
    if (!shared || serial)
        *stream_end() = t0;
    for (i = 0; secs ? now_ns() < stop : i < n; i++) {
        in_before = 1;
        if (__builtin_expect(vgpu_limiter_enabled, 0)) /* exactly what the launch wrappers do */
            vgpu_limiter_before_launch((CUstream)0, 0, 42, 0);
        in_before = 0;
        start = gpu_launch(k_ns); /* the launch */
        if (pending >= 0)
            local_ts[pending] = start;
        pending = -1;
        if (__builtin_expect(vgpu_limiter_enabled, 0))
            vgpu_limiter_after_launch((CUstream)0);
        if (!strcmp(mode, "sync") || !strcmp(mode, "sparse") || (i % sync_every == sync_every - 1))
            gpu_drain();
        if (!strcmp(mode, "sparse"))
            sleep_until(now_ns() + 4 * k_ns);
    }
    gpu_drain();
    printf("enabled=%d wall_ms=%.3f gpu_ms=%.3f kernels=%d\n", vgpu_limiter_throttles(),
           (double)(now_ns() - t0) / 1e6, (double)k_ns * i / 1e6, i);
    return 0;
}
