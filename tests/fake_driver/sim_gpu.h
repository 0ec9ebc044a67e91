/* A GPU shared by processes through a file, time-slicing between them as an H200 does without MPS
 * (measured there: a 2.18 ms kernel takes 4.63 ms beside one other busy context and 6.90 ms beside
 * two; 29 us kernels are never stretched, contexts take turns between them). Used by the limiter's
 * simulator (c_src/tests/limiter/limiter_sim.c) and by the fake driver's events (fake_events.c).
 * Two regimes:
 *   slice: processor sharing: while k processes have work queued, each one's work progresses at 1/k
 *     speed, less what the GPU loses switching between them (SIM_GPU_SWITCH_LOSS, 0.06 by default:
 *     the H200's 2.18 ms kernel took 4.63 ms beside one busy context, so two bare processes together
 *     get 0.94 of one alone, and 0.90 in a 3 s loop that syncs every 8 kernels), so a kernel is
 *     stretched by every other busy process; an event completes when the work its process had
 *     queued when it was recorded is done;
 *   serial: kernels of all processes run one at a time, in launch order, none stretched (the
 *     simulator resolves its events itself);
 *   turns (SIM_GPU_TURNS=SWITCH_US[,SLICE_US] with slice): the GPU belongs to one process at a time and
 *     runs its queue; it turns to the next process with work when the owner's queue runs dry or, while
 *     others wait, when the owner has had SLICE_US (2000 by default) of it, and each turn costs SWITCH_US
 *     in which nobody's work progresses. Work queued while another owns the GPU, events recorded
 *     included, waits for its owner's turn. This is how an H200 takes turns between contexts running
 *     a loop of short kernels that syncs every few launches (bench/gpu_turns.py): a turn at each
 *     batch, so two such loops get far less than one alone, and the cost falls on whoever is turned to.
 * Within a process, kernels take their time one after another whatever their stream, unless
 *   sms (the fake driver's FAKE_SM_MODEL=1, with slice or turns): the regimes above share the GPU's time
 *     between contexts; this one says what a context does with its time. A kernel holds the share of the
 *     SMs its grid fills (min(blocks, SMs x blocks an SM holds) of those slots: fake_events.c and sm.h, the
 *     rule the driver's occupancy API answers) for one kernel's time per wave of that many blocks, so a
 *     1-block kernel takes as long as one that fills the GPU but holds next to none of it. Kernels of one
 *     process on different streams run at the same time while the SMs they hold fit in the GPU (sum <= 1);
 *     a kernel that does not fit waits for SMs to free, as the block scheduler hands them out in launch
 *     order (so kernels that fill the GPU together take their turns). This is planned at each launch on the
 *     context's own clock (the work it has done, `done`): the process's work is then the time to the end
 *     of its plan, and that is what it queues for the time-slicing above, whose accounting (busy time,
 *     events, NVML's utilisation) is unchanged. Between processes, no MPS: their contexts still take turns.
 * State: one row per process, the lock is a flock on the file; the SM model's plan is each process's own.
 * Header-only: each user is one file. */
#ifndef SIM_GPU_H
#define SIM_GPU_H

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* each user takes what it needs of these */
#define SIM_FN static __attribute__((unused))

#define SIM_PROCS 64
#define SIM_EVENTS 130 /* the limiter's ring holds 64 pairs, and its reference event */

struct sim_proc {
    int pid;
    long long queued;    /* slice: work launched and not yet done (ns of GPU time) */
    long long done;      /* slice: work done so far */
    long long submitted; /* slice: work launched so far */
    long long q_end;     /* serial: when this process's stream is free */
    struct {
        long long target; /* done when `done` reaches it */
        long long ts;     /* when it did; 0 = not yet */
    } ev[SIM_EVENTS];
};

struct sim_gpu {
    long long t;        /* slice: the time the shared state is advanced to */
    long long gpu_free; /* serial: when the GPU is next free */
    int owner;          /* turns: whose turn it is (index + 1; 0 nobody's yet) */
    int contended;      /* turns: others waited at the last step */
    long long sw_end;   /* turns: the turn to `owner` is done then */
    long long turn_at;  /* turns: the owner's slice began then */
    long long util_t;   /* slice, turns: the utilisation below is accounted up to then */
    long long util_ppm; /* ... the share of the last UTIL_NS or so with work running (NVML's utilisation) */
    struct sim_proc proc[SIM_PROCS];
};
#define UTIL_NS 100000000ll /* about NVML's sample period on a datacenter GPU */

static struct sim_gpu *shared;
static int gpu_fd = -1, serial;
static long long keep_ppm = -1; /* of the GPU's time, what goes to work while several share it */
static long long turn_switch_ns = -1, turn_slice_ns; /* turns: 0 off */
static struct sim_proc *me;

SIM_FN long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

SIM_FN void lock(void)
{
    while (flock(gpu_fd, LOCK_EX) != 0)
        ;
}

SIM_FN void unlock(void)
{
    flock(gpu_fd, LOCK_UN);
}

SIM_FN int turns_on(void)
{
    if (turn_switch_ns < 0) {
        const char *v = getenv("SIM_GPU_TURNS"), *comma = v ? strchr(v, ',') : 0;
        turn_switch_ns = v ? atoll(v) * 1000 : 0;
        turn_slice_ns = comma ? atoll(comma + 1) * 1000 : 2000000;
    }
    return turn_switch_ns > 0;
}

/* turns: an event of p that waits only for p's turn (all the work before it is done) */
SIM_FN int event_waiting(const struct sim_proc *p)
{
    int j;
    for (j = 0; j < SIM_EVENTS; j++)
        if (p->ev[j].target && !p->ev[j].ts && p->ev[j].target <= p->done)
            return 1;
    return 0;
}

SIM_FN int has_work(const struct sim_proc *p)
{
    return p->pid && (p->queued > 0 || event_waiting(p));
}

/* turns, lock held: the next process with work after index o (o itself only when nobody else has any);
 * -1 none */
SIM_FN int next_turn(int o)
{
    int i, n;
    for (n = 1; n <= SIM_PROCS; n++) {
        i = (o + n) % SIM_PROCS;
        if (has_work(&shared->proc[i]))
            return i;
    }
    return -1;
}

/* lock held: the GPU was busy (or idle) from util_t up to t */
SIM_FN void util_to(long long t, int busy)
{
    long long s = t - shared->util_t, a;

    if (s <= 0)
        return;
    a = s >= UTIL_NS ? 1000000 : s * 1000000 / UTIL_NS;
    shared->util_ppm += ((busy ? 1000000 : 0) - shared->util_ppm) * a / 1000000;
    shared->util_t = t;
}

/* turns, lock held: see the top */
SIM_FN void advance_turns(long long now)
{
    long long t = shared->t, run, left, before;
    int o, i, j, others, n;

    while (t < now) {
        if (shared->sw_end > t) {
            if (shared->sw_end >= now)
                break;
            util_to(shared->sw_end, 1);
            t = shared->turn_at = shared->sw_end;
        }
        o = shared->owner - 1;
        struct sim_proc *p = o >= 0 ? &shared->proc[o] : 0;
        if (p && p->pid)
            for (j = 0; j < SIM_EVENTS; j++) /* recorded behind finished work: done as its turn comes */
                if (p->ev[j].target && !p->ev[j].ts && p->ev[j].target <= p->done)
                    p->ev[j].ts = t;
        for (i = 0, others = 0; i < SIM_PROCS; i++)
            others |= i != o && has_work(&shared->proc[i]);
        if (others && !shared->contended)
            shared->turn_at = t; /* the slice counts from when someone else waits */
        shared->contended = others;
        if (p && p->pid && p->queued > 0) {
            run = p->queued < now - t ? p->queued : now - t;
            left = shared->turn_at + turn_slice_ns - t;
            if (!others || left > 0) {
                if (others && run > left)
                    run = left;
                before = p->done;
                p->done += run;
                p->queued -= run;
                for (j = 0; j < SIM_EVENTS; j++)
                    if (!p->ev[j].ts && p->ev[j].target > before && p->ev[j].target <= p->done)
                        p->ev[j].ts = t + (p->ev[j].target - before);
                t += run;
                util_to(t, 1);
                continue;
            }
        }
        n = next_turn(o < 0 ? SIM_PROCS - 1 : o);
        if (n < 0 || n == o)
            break; /* idle, or the owner's own events are all stamped */
        shared->owner = n + 1;
        shared->sw_end = t + turn_switch_ns;
        shared->contended = 0;
    }
    util_to(now, 0);
    shared->t = now;
}

/* slice, lock held: run the processor-sharing GPU forward to `now`, stamping events as they complete */
SIM_FN void advance(long long now)
{
    long long t = shared->t, least, step, per, before;
    int i, j, k;

    if (turns_on()) {
        advance_turns(now);
        return;
    }

    while (t < now) {
        for (i = 0, k = 0, least = 0; i < SIM_PROCS; i++)
            if (shared->proc[i].pid && shared->proc[i].queued > 0) {
                k++;
                if (!least || shared->proc[i].queued < least)
                    least = shared->proc[i].queued;
            }
        if (!k)
            break;
        if (keep_ppm < 0) {
            const char *loss = getenv("SIM_GPU_SWITCH_LOSS");
            keep_ppm = 1000000 - (long long)((loss ? atof(loss) : 0.06) * 1e6);
        }
        step = k > 1 ? (least * k * 1000000 + keep_ppm - 1) / keep_ppm : least; /* the shortest queue done */
        if (step > now - t)
            step = now - t;
        per = k > 1 ? step * keep_ppm / 1000000 / k : step;
        if (per > least)
            per = least;
        if (per <= 0)
            break;
        for (i = 0; i < SIM_PROCS; i++) {
            struct sim_proc *p = &shared->proc[i];
            if (!p->pid || p->queued <= 0)
                continue;
            before = p->done;
            p->done += per;
            p->queued -= per;
            for (j = 0; j < SIM_EVENTS; j++)
                if (!p->ev[j].ts && p->ev[j].target && p->ev[j].target <= p->done)
                    p->ev[j].ts = t + (p->ev[j].target - before) * step / per;
        }
        t += step;
        util_to(t, 1);
    }
    util_to(now, 0);
    shared->t = now;
}

/* sms: this process's kernels that are not done yet, as runs of them on its context's clock (see the top) */
#define SIM_PPM 1000000ll /* the whole GPU's SMs */
#define SIM_RUNS 32
#define SIM_ALL_STREAMS (~0ull)
static struct sim_run {
    long long start, end;      /* on the context's clock (done) */
    unsigned long long stream; /* whose kernels; SIM_ALL_STREAMS: several streams' (no room, see sim_launch) */
    long long ppm;             /* of the SMs they hold */
} runs[SIM_RUNS];
static int nruns;

/* sms: the SMs (ppm) this process's kernels hold at x */
SIM_FN long long sms_held(long long x)
{
    long long sum = 0;
    int i;
    for (i = 0; i < nruns; i++)
        if (runs[i].start <= x && x < runs[i].end)
            sum += runs[i].ppm;
    return sum;
}

/* sms: whether ppm more of the SMs are free throughout [at, at + ns) (what is held rises only where a run starts) */
SIM_FN int sms_free(long long at, long long ns, long long ppm)
{
    int i;
    if (sms_held(at) + ppm > SIM_PPM)
        return 0;
    for (i = 0; i < nruns; i++)
        if (runs[i].start > at && runs[i].start < at + ns && sms_held(runs[i].start) + ppm > SIM_PPM)
            return 0;
    return 1;
}

/* sms, lock held (after advance): a kernel of ns on `stream`, holding ppm of the SMs. It starts once its
 * stream's kernels before it are done and, from then, at the first moment (now or the end of a run) when its
 * SMs are free throughout its time; the end of everything (`submitted`) always is. What it adds to the
 * process's work is how much later its plan now ends. */
SIM_FN void sim_launch(unsigned long long stream, long long ns, long long ppm)
{
    long long at = me->done, end = me->submitted, start;
    int i, j;

    if (ns <= 0)
        return;
    for (i = j = 0; i < nruns; i++) /* forget the runs that are done */
        if (runs[i].end > me->done)
            runs[j++] = runs[i];
    nruns = j;
    for (i = 0; i < nruns; i++)
        if ((runs[i].stream == stream || runs[i].stream == SIM_ALL_STREAMS) && runs[i].end > at)
            at = runs[i].end;
    start = at;
    if (!sms_free(at, ns, ppm))
        for (start = end, i = 0; i < nruns; i++) /* the first end of a run after which it fits */
            if (runs[i].end > at && runs[i].end < start && sms_free(runs[i].end, ns, ppm))
                start = runs[i].end;
    for (i = 0; i < nruns; i++) /* the stream's run goes on: a loop of one shape is one run */
        if (runs[i].stream == stream && runs[i].ppm == ppm && runs[i].end == start)
            break;
    if (i < nruns) {
        runs[i].end = start + ns;
    } else if (nruns < SIM_RUNS) {
        runs[nruns++] = (struct sim_run){start, start + ns, stream, ppm};
    } else { /* no room to plan it: after everything, in the last run, which then holds the GPU for every stream */
        for (i = 0, j = 1; j < nruns; j++)
            if (runs[j].end > runs[i].end)
                i = j; /* the last to end, at `end` */
        start = end;
        runs[i].end = start + ns;
        runs[i].stream = SIM_ALL_STREAMS;
        runs[i].ppm = SIM_PPM;
    }
    if (start + ns > end) {
        me->queued += start + ns - end;
        me->submitted = start + ns;
    }
}

SIM_FN void leave(void)
{
    if (me && !serial) {
        lock();
        advance(now_ns());
        me->queued = 0;
        me->pid = 0;
        unlock();
    } else if (me) {
        me->pid = 0;
    }
}

SIM_FN void gpu_open(const char *path, int serial_mode)
{
    int i;

    serial = serial_mode;
    gpu_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (gpu_fd < 0)
        exit(4);
    lock();
    if (ftruncate(gpu_fd, sizeof *shared) != 0)
        exit(4);
    shared = mmap(0, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED, gpu_fd, 0);
    if (shared == MAP_FAILED)
        exit(4);
    if (!shared->t)
        shared->t = now_ns();
    for (i = 0; i < SIM_PROCS && !me; i++)
        if (!shared->proc[i].pid) {
            me = &shared->proc[i];
            memset(me, 0, sizeof *me);
            me->pid = getpid();
            me->q_end = now_ns();
        }
    unlock();
    if (!me)
        exit(4);
    atexit(leave);
}


/* slice, lock held (after advance): event slot i recorded now, behind everything this process launched;
 * with turns, an event behind finished work still waits for this process's turn */
SIM_FN void sim_record(int i, long long now)
{
    int mine = !turns_on() || !me->submitted ||
               (shared->owner == (int)(me - shared->proc) + 1 && shared->sw_end <= now);
    me->ev[i].target = me->submitted;
    me->ev[i].ts = me->done >= me->submitted && mine ? now : 0;
}

/* slice: wait until everything this process launched is done */
SIM_FN void drain(void)
{
    struct timespec nap = {0, 100000};
    for (;;) {
        long long left;
        lock();
        advance(now_ns());
        left = me->queued;
        unlock();
        if (left <= 0)
            return;
        nanosleep(&nap, 0);
    }
}

#endif
