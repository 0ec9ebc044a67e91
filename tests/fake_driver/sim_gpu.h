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
 * State: one row per process, the lock is a flock on the file. Header-only: each user is one file. */
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
