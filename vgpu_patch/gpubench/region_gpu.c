/* GPU program for tests/gpu/test_region_gpu.py (run under LD_PRELOAD=libvgpu.so on a real GPU).
 * Driver entry points come from dlopen("libcuda.so.1") + dlsym, like tests/gpu/probe.c.
 *   region_gpu hold MIB      allocate MIB in 512 MiB pieces (until refused), print, wait for a
 *                            line on stdin, free, print cuMemGetInfo
 *   region_gpu loop SECONDS  compute-bound kernel loop (a dependent FMA chain in one full wave of
 *                            blocks, JIT-compiled from PTX): launches, sync every 8; prints kernels/s.
 *                            SPIN_ITERS sets the chain's length (1<<18: about 2.2 ms a kernel on an
 *                            H200); SPIN_BLOCKS the grid (default 4 blocks of 256 threads an SM; it also
 *                            prints per_sm, how many such blocks one SM holds); LOOP_START_AT (CLOCK_MONOTONIC seconds) makes processes started
 *                            together begin their timed loops at the same instant; LOOP_WINDOW=FROM,TO
 *                            adds window_kernels_per_s, the rate within that common window;
 *                            LOOP_TRACE=FILE writes each kernel's launch (CLOCK_MONOTONIC ns) and its
 *                            start and end on the GPU's %globaltimer (common to every context), with
 *                            the two clocks' offset, for bench/gpu_turns.py
 *   region_gpu steps SECONDS decode-like steps: one kernel (SPIN_BLOCKS blocks of 256 threads, SPIN_ITERS),
 *                            then cuStreamSynchronize; prints steps_per_s and each step's latency
 *                            (launch to the sync's return): p50_us, p90_us, p99_us, max_us (bench/gpu_steps.py)
 *   region_gpu cold STEPS    a decode step loop from a cold start, as GPU-Virt-Bench's LLM-004 runs it: no
 *                            warm-up, each step a 32-block kernel and a 1-block kernel on a created stream,
 *                            then that stream's sync; prints cold_p50_us, cold_p90_us, cold_max_us and the
 *                            first ten steps (cold_first_us). COLD_PREFILL=N first runs N every-SM kernels
 *                            of 65000 iterations (about 550 us each), a sync after each: decode after prefill
 *   region_gpu onset SECONDS how soon a limit takes hold after idle: 200 ms idle, then steps of one
 *                            every-SM kernel (SPIN_ITERS, default about 100 us) and a sync; prints hold_ms,
 *                            when the first step slower than 1.5 x the first five's median ended (-1: none),
 *                            and each 10 ms bucket's busy fraction over the first 100 ms (busy_10ms)
 * Prints key=value lines. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#define SYM(name) static __typeof__(&name) p_##name;
#define LOAD(name) \
    if (!(p_##name = (__typeof__(&name))dlsym(lib, #name))) { printf("missing=%s\n", #name); return 2; }
#define FUNCS(X) X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc_v2) \
    X(cuMemFree_v2) X(cuMemGetInfo_v2) X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel) \
    X(cuCtxSynchronize) X(cuDeviceGetAttribute) X(cuMemsetD8_v2) X(cuMemcpyDtoH_v2) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuStreamSynchronize) X(cuStreamCreate)
FUNCS(SYM)

static const size_t MiB = 1 << 20;

/* out[tid] = a long dependent FMA chain: SM-bound, no memory traffic */
static const char PTX[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry spin(.param .u64 out, .param .u32 iters)\n{\n"
    "  .reg .pred p;\n  .reg .b32 r<4>;\n  .reg .f32 f<3>;\n  .reg .b64 rd<4>;\n"
    "  ld.param.u64 rd1, [out];\n  ld.param.u32 r1, [iters];\n  mov.u32 r2, %tid.x;\n"
    "  cvt.rn.f32.u32 f1, r2;\n  mov.f32 f2, 0f3F7FFFFE;\n  mov.u32 r3, 0;\n"
    "LOOP:\n  fma.rn.f32 f1, f1, f2, 0f3F000000;\n  add.u32 r3, r3, 1;\n  setp.lt.u32 p, r3, r1;\n"
    "  @p bra LOOP;\n"
    "  cvta.to.global.u64 rd2, rd1;\n  mul.wide.u32 rd3, r2, 4;\n  add.u64 rd2, rd2, rd3;\n"
    "  st.global.f32 [rd2], f1;\n  ret;\n}\n"
    /* the same, and thread 0 of each block folds its start (complemented: max of ~t is the least t) and
     * end on the global timer into rec[0] and rec[1] */
    ".visible .entry spin_t(.param .u64 out, .param .u32 iters, .param .u64 rec)\n{\n"
    "  .reg .pred p, q;\n  .reg .b32 r<4>;\n  .reg .f32 f<3>;\n  .reg .b64 rd<9>;\n"
    "  mov.u64 rd5, %globaltimer;\n"
    "  ld.param.u64 rd1, [out];\n  ld.param.u32 r1, [iters];\n  ld.param.u64 rd4, [rec];\n  mov.u32 r2, %tid.x;\n"
    "  cvt.rn.f32.u32 f1, r2;\n  mov.f32 f2, 0f3F7FFFFE;\n  mov.u32 r3, 0;\n"
    "LOOP:\n  fma.rn.f32 f1, f1, f2, 0f3F000000;\n  add.u32 r3, r3, 1;\n  setp.lt.u32 p, r3, r1;\n"
    "  @p bra LOOP;\n"
    "  cvta.to.global.u64 rd2, rd1;\n  mul.wide.u32 rd3, r2, 4;\n  add.u64 rd2, rd2, rd3;\n"
    "  st.global.f32 [rd2], f1;\n  setp.ne.u32 q, r2, 0;\n  @q bra DONE;\n"
    "  mov.u64 rd6, %globaltimer;\n  not.b64 rd5, rd5;\n  cvta.to.global.u64 rd4, rd4;\n"
    "  atom.global.max.u64 rd7, [rd4], rd5;\n  atom.global.max.u64 rd8, [rd4+8], rd6;\n"
    "DONE:\n  ret;\n}\n"
    ".visible .entry stamp(.param .u64 rec)\n{\n  .reg .b64 rd<3>;\n  mov.u64 rd1, %globaltimer;\n"
    "  ld.param.u64 rd2, [rec];\n  cvta.to.global.u64 rd2, rd2;\n  st.global.u64 [rd2], rd1;\n  ret;\n}\n";

#define TRACE_MAX (1 << 20) /* kernels traced at most */

/* the global timer's offset from CLOCK_MONOTONIC: the stamp with the tightest bracket of 50 */
static long long timer_offset(CUmodule mod, CUdeviceptr rec)
{
    CUfunction fn;
    void *args[1] = {&rec};
    long long best = -1, off = 0;
    int i;

    if (p_cuModuleGetFunction(&fn, mod, "stamp"))
        return 0;
    for (i = 0; i < 50; i++) {
        struct timespec a, b;
        unsigned long long g = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        p_cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
        p_cuCtxSynchronize();
        clock_gettime(CLOCK_MONOTONIC, &b);
        p_cuMemcpyDtoH_v2(&g, rec, sizeof g);
        long long ta = a.tv_sec * 1000000000ll + a.tv_nsec, tb = b.tv_sec * 1000000000ll + b.tv_nsec;
        if (best < 0 || tb - ta < best)
            best = tb - ta, off = (long long)g - (ta + tb) / 2;
    }
    return off;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int do_hold(long mib)
{
    CUdeviceptr ptrs[1024];
    size_t f = 0, t = 0;
    int n = 0, i;
    CUresult rc = CUDA_SUCCESS;
    char line[16];

    while (n < 1024 && (long)(n * 512) < mib && (rc = p_cuMemAlloc_v2(&ptrs[n], 512 * MiB)) == CUDA_SUCCESS)
        n++;
    p_cuMemGetInfo_v2(&f, &t);
    printf("allocated_mib=%d\nlast_rc=%d\nfree=%zu\ntotal=%zu\nready=1\n", n * 512, rc, f, t);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        line[0] = 0;
    for (i = 0; i < n; i++)
        p_cuMemFree_v2(ptrs[i]);
    return 0;
}

static int do_loop(double seconds)
{
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr out;
    unsigned iters = (unsigned)(getenv("SPIN_ITERS") ? atoi(getenv("SPIN_ITERS")) : 1 << 18);
    int sms = 0, launched = 0, first_n = 0, last_n = 0, per_sm = 0;
    unsigned blocks;
    void *args[3];
    const char *trace = getenv("LOOP_TRACE");
    CUdeviceptr rec = 0, recp = 0;
    long long *launch_at = 0, offset = 0;
    double t0, t1, w0 = 1e300, w1 = -1, first_at = -1, last_at = -1;
    CUresult rc;

    if ((rc = p_cuModuleLoadData(&mod, PTX)) || (rc = p_cuModuleGetFunction(&fn, mod, "spin")) ||
        (rc = p_cuMemAlloc_v2(&out, 1024 * sizeof(float)))) {
        printf("setup_rc=%d\n", rc);
        return 1;
    }
    p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
    blocks = getenv("SPIN_BLOCKS") ? (unsigned)atoi(getenv("SPIN_BLOCKS")) : (unsigned)sms * 4;
    if (p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, 0) != CUDA_SUCCESS)
        per_sm = 0;
    args[0] = &out;
    args[1] = &iters;
    if (trace && (p_cuModuleGetFunction(&fn, mod, "spin_t") || p_cuMemAlloc_v2(&rec, TRACE_MAX * 16ull) ||
                  p_cuMemsetD8_v2(rec, 0, TRACE_MAX * 16ull) || !(launch_at = calloc(TRACE_MAX, 8)))) {
        printf("trace_setup=failed\n");
        return 1;
    }
    if (trace)
        offset = timer_offset(mod, rec + (TRACE_MAX - 1) * 16ull);
    recp = rec;
    args[2] = &recp;
    /* warm-up: JIT, clocks */
    p_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0);
    p_cuCtxSynchronize();
    if (trace)
        p_cuMemsetD8_v2(rec, 0, (TRACE_MAX - 1) * 16ull); /* the warm-up's record out */
    if (getenv("LOOP_START_AT")) {
        double at = atof(getenv("LOOP_START_AT"));
        while (now_s() < at) {
            struct timespec nap = {0, 1000000};
            nanosleep(&nap, 0);
        }
    }
    /* LOOP_WINDOW=FROM,TO (CLOCK_MONOTONIC seconds): also the rate between the first synchronize at or
     * after FROM and the last one at or before TO, a window common to processes started apart */
    if (getenv("LOOP_WINDOW"))
        sscanf(getenv("LOOP_WINDOW"), "%lf,%lf", &w0, &w1);
    t0 = now_s();
    t1 = t0;
    while (t1 - t0 < seconds) {
        if (trace && launched < TRACE_MAX - 1) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            launch_at[launched] = ts.tv_sec * 1000000000ll + ts.tv_nsec;
            recp = rec + (CUdeviceptr)launched * 16u;
        }
        if ((rc = p_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0)) != CUDA_SUCCESS) {
            printf("launch_rc=%d\n", rc);
            return 1;
        }
        if (++launched % 8 == 0) {
            p_cuCtxSynchronize();
            t1 = now_s();
            if (t1 >= w0 && first_at < 0)
                first_at = t1, first_n = launched;
            if (t1 <= w1)
                last_at = t1, last_n = launched;
        }
    }
    p_cuCtxSynchronize();
    t1 = now_s();
    printf("sms=%d\nper_sm=%d\nblocks=%u\n", sms, per_sm, blocks);
    printf("kernels=%d\nseconds=%.3f\nkernels_per_s=%.2f\n", launched, t1 - t0, launched / (t1 - t0));
    if (first_at >= 0 && last_at > first_at)
        printf("window_kernels_per_s=%.2f\n", (last_n - first_n) / (last_at - first_at));
    if (trace) { /* offset, then one line a kernel: launch (our clock), start, end (the GPU's timer) */
        int n = launched < TRACE_MAX - 1 ? launched : TRACE_MAX - 1, i;
        unsigned long long *se = malloc((size_t)n * 16u + 16u);
        FILE *f = fopen(trace, "w");
        if (!se || !f || p_cuMemcpyDtoH_v2(se, rec, (size_t)n * 16u)) {
            printf("trace_write=failed\n");
            return 1;
        }
        fprintf(f, "%lld\n", offset);
        for (i = 0; i < n; i++)
            fprintf(f, "%lld %llu %llu\n", launch_at[i], ~se[2 * i], se[2 * i + 1]);
        fclose(f);
    }
    return 0;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define STEPS_MAX 2000000

/* steps of one kernel (blocks of 256 threads) and a sync, for `seconds` (at most STEPS_MAX): each step's
 * latency, launch to the sync's return, in lat and when it ended (from the first's launch) in end, both in
 * seconds; how many, -1 on a failed step */
static int step_loop(CUfunction fn, unsigned blocks, void **args, double seconds, double *lat, double *end)
{
    double t0, t, a;
    int n;
    CUresult rc;

    for (n = 0, t0 = t = now_s(); t - t0 < seconds && n < STEPS_MAX; n++) {
        a = t;
        if ((rc = p_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0)) || (rc = p_cuStreamSynchronize(0))) {
            printf("step_rc=%d\n", rc);
            return -1;
        }
        t = now_s();
        lat[n] = t - a;
        end[n] = t - t0;
    }
    return n;
}

static int do_steps(double seconds)
{
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr out;
    unsigned iters = (unsigned)(getenv("SPIN_ITERS") ? atoi(getenv("SPIN_ITERS")) : 1000), blocks;
    int sms = 0, n, i;
    void *args[2];
    double *lat = malloc(STEPS_MAX * sizeof *lat), *end = malloc(STEPS_MAX * sizeof *end);
    CUresult rc;

    if (!lat || !end || (rc = p_cuModuleLoadData(&mod, PTX)) || (rc = p_cuModuleGetFunction(&fn, mod, "spin")) ||
        (rc = p_cuMemAlloc_v2(&out, 1 << 20))) {
        printf("setup=failed\n");
        return 1;
    }
    p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
    blocks = getenv("SPIN_BLOCKS") ? (unsigned)atoi(getenv("SPIN_BLOCKS")) : (unsigned)sms * 4;
    args[0] = &out;
    args[1] = &iters;
    for (i = 0; i < 100; i++) { /* warm-up: JIT, clocks */
        p_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0);
        p_cuStreamSynchronize(0);
    }
    if ((n = step_loop(fn, blocks, args, seconds, lat, end)) < 1)
        return 1;
    qsort(lat, (size_t)n, sizeof *lat, by_value);
    printf("blocks=%u\nsteps=%d\nsteps_per_s=%.1f\n", blocks, n, n / end[n - 1]);
    printf("p50_us=%.1f\np90_us=%.1f\np99_us=%.1f\nmax_us=%.1f\n", lat[n / 2] * 1e6, lat[(int)(n * 0.9)] * 1e6,
           lat[(int)(n * 0.99)] * 1e6, lat[n - 1] * 1e6);
    return 0;
}

static int do_cold(int steps)
{
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr out;
    CUstream s;
    unsigned iters = (unsigned)(getenv("SPIN_ITERS") ? atoi(getenv("SPIN_ITERS")) : 64);
    void *args[2] = {&out, &iters};
    double lat[1000], sorted[1000], a;
    int n, i;
    CUresult rc;

    if (steps < 1 || steps > 1000 || (rc = p_cuModuleLoadData(&mod, PTX)) ||
        (rc = p_cuModuleGetFunction(&fn, mod, "spin")) || (rc = p_cuMemAlloc_v2(&out, 1 << 20)) ||
        (rc = p_cuStreamCreate(&s, 0))) {
        printf("setup=failed\n");
        return 1;
    }
    if (getenv("COLD_PREFILL")) {
        unsigned long_iters = 65000;
        void *long_args[2] = {&out, &long_iters};
        int sms = 0, k = atoi(getenv("COLD_PREFILL"));
        p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
        for (i = 0; i < k; i++)
            if ((rc = p_cuLaunchKernel(fn, (unsigned)sms * 4, 1, 1, 256, 1, 1, 0, s, long_args, 0)) ||
                (rc = p_cuStreamSynchronize(s))) {
                printf("prefill_rc=%d\n", rc);
                return 1;
            }
    }
    for (n = 0; n < steps; n++) {
        a = now_s();
        if ((rc = p_cuLaunchKernel(fn, 32, 1, 1, 256, 1, 1, 0, s, args, 0)) ||
            (rc = p_cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, s, args, 0)) || (rc = p_cuStreamSynchronize(s))) {
            printf("step_rc=%d\n", rc);
            return 1;
        }
        lat[n] = sorted[n] = (now_s() - a) * 1e6;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_value);
    printf("steps=%d\ncold_p50_us=%.1f\ncold_p90_us=%.1f\ncold_max_us=%.1f\ncold_first_us=", n, sorted[n / 2],
           sorted[n * 9 / 10], sorted[n - 1]);
    for (i = 0; i < n && i < 10; i++)
        printf("%s%.1f", i ? "," : "", lat[i]);
    printf("\n");
    return 0;
}

static int do_onset(double seconds)
{
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr out;
    unsigned iters = (unsigned)(getenv("SPIN_ITERS") ? atoi(getenv("SPIN_ITERS")) : 12000), blocks;
    int sms = 0, n, i, hold = -1;
    void *args[2] = {&out, &iters};
    double *lat = malloc(STEPS_MAX * sizeof *lat), *end = malloc(STEPS_MAX * sizeof *end), first[5];
    double busy[10] = {0};
    struct timespec idle = {0, 200000000};
    CUresult rc;

    if (!lat || !end || (rc = p_cuModuleLoadData(&mod, PTX)) || (rc = p_cuModuleGetFunction(&fn, mod, "spin")) ||
        (rc = p_cuMemAlloc_v2(&out, 1 << 20))) {
        printf("setup=failed\n");
        return 1;
    }
    p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
    blocks = (unsigned)sms * 4;
    p_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0); /* JIT */
    p_cuStreamSynchronize(0);
    nanosleep(&idle, 0); /* idle: the budget refills */
    if ((n = step_loop(fn, blocks, args, seconds, lat, end)) < 0)
        return 1;
    if (n < 10) {
        printf("steps=%d\n", n);
        return 1;
    }
    memcpy(first, lat, sizeof first);
    qsort(first, 5, sizeof *first, by_value);
    for (i = 5; i < n && hold < 0; i++)
        if (lat[i] > 1.5 * first[2])
            hold = i;
    /* the GPU time of a step is the first five's median: a 10 ms bucket's busy share is that over its wall */
    for (i = 0; i < n; i++)
        if (end[i] < 0.1)
            busy[(int)(end[i] * 100)] += first[2] / 0.01;
    printf("steps=%d\nstep_us=%.1f\nhold_ms=%.1f\nbusy_10ms=", n, first[2] * 1e6, hold < 0 ? -1.0 : end[hold] * 1e3);
    for (i = 0; i < 10; i++)
        printf("%s%.2f", i ? "," : "", busy[i]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUdevice dev;
    CUcontext ctx;

    if (!lib || argc != 3) {
        printf("usage_or_dlopen=failed\n");
        return 2;
    }
    FUNCS(LOAD)
    if (p_cuInit(0) || p_cuDeviceGet(&dev, 0) || p_cuDevicePrimaryCtxRetain(&ctx, dev) || p_cuCtxSetCurrent(ctx)) {
        printf("init=failed\n");
        return 1;
    }
    if (!strcmp(argv[1], "hold"))
        return do_hold(atol(argv[2]));
    if (!strcmp(argv[1], "loop"))
        return do_loop(atof(argv[2]));
    if (!strcmp(argv[1], "steps"))
        return do_steps(atof(argv[2]));
    if (!strcmp(argv[1], "cold"))
        return do_cold(atoi(argv[2]));
    if (!strcmp(argv[1], "onset"))
        return do_onset(atof(argv[2]));
    return 2;
}
