/* A test double of a vendor-format region writer (not part of the shim), written from the layout
 * and behaviour facts in shared/hami-compat.md only. What it does the way vendor builds do:
 * - creates the file 0666 and sizes it with ftruncate (sparse); locks with the region's sem_t;
 * - stores sm_limit = 100 when no SM limit is set; writes last_kernel_time at creation and on
 *   launches at most once a second; stops launching while recent_kernel < 0;
 * - never writes a slot's unused[] words (nor used[d].unused[]): a slot it takes over keeps what
 *   the previous owner left there;
 * - takes over a slot that carries its own pid; on exit compacts the table: live slots move down
 *   (whole-struct copies), proc_num shrinks.
 * Steps, one line of output each (like region_tool):
 *   attach  reserve:D:N  used:D  slot  procnum  wait  kill  exit (compact, then exit 0)
 *   launch:N:MS (N launches MS ms apart; prints how many seconds it was held back)
 *   spawn:PROG;ARGS...  run PROG with ARGS (';'-separated) as a child and wait for it
 * Limits from CUDA_DEVICE_MEMORY_LIMIT (<N>m only) and CUDA_DEVICE_SM_LIMIT (a plain number). */
#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "region/layout.h"

static vgpu_region_t *r;
static long long last_stamp;

static void lock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    while (sem_timedwait(&r->sem, &ts) != 0 && errno == EINTR)
        ;
}

static void unlock(void)
{
    sem_post(&r->sem);
}

static int alive(int pid)
{
    return pid > 0 && !(kill(pid, 0) != 0 && errno == ESRCH);
}

static vgpu_proc_slot_t *mine(void)
{
    int i, me = getpid();
    for (i = 0; i < r->proc_num && i < VGPU_MAX_PROCS; i++)
        if (r->procs[i].pid == me && r->procs[i].status)
            return &r->procs[i];
    return 0;
}

/* the fields a vendor claim writes: never unused[] */
static void fill(vgpu_proc_slot_t *s)
{
    int d;
    s->pid = getpid();
    s->hostpid = 0;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        s->used[d].context_size = s->used[d].module_size = s->used[d].data_size = 0;
        s->used[d].offset = s->used[d].total = 0;
        s->monitorused[d] = 0;
        s->device_util[d].dec_util = s->device_util[d].enc_util = s->device_util[d].sm_util = 0;
    }
    s->status = VGPU_SLOT_RUNNING;
}

static void compact(int drop_self)
{
    int i, j = 0, me = getpid();
    for (i = 0; i < r->proc_num && i < VGPU_MAX_PROCS; i++) {
        vgpu_proc_slot_t *s = &r->procs[i];
        if (!s->status || !alive(s->pid) || (drop_self && s->pid == me))
            continue;
        if (i != j)
            r->procs[j] = *s; /* whole-struct copy */
        j++;
    }
    r->proc_num = j;
}

static int attach(void)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    const char *mem = getenv("CUDA_DEVICE_MEMORY_LIMIT"), *sm = getenv("CUDA_DEVICE_SM_LIMIT");
    struct stat st;
    int fd, d;
    void *p;

    fd = open(path, O_RDWR | O_CREAT, 0666);
    if (fd < 0 || fstat(fd, &st) != 0)
        return -1;
    if (st.st_size == 0 && ftruncate(fd, sizeof(vgpu_region_t)) != 0)
        return -1;
    p = mmap(0, sizeof(vgpu_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    r = p;
    if (r->initialized_flag != VGPU_REGION_MAGIC) {
        sem_init(&r->sem, 1, 1);
        r->major_version = VGPU_REGION_MAJOR;
        r->minor_version = VGPU_REGION_MINOR;
        r->device_num = 1;
        for (d = 0; d < VGPU_MAX_DEVICES; d++) {
            r->limit[d] = mem ? strtoull(mem, 0, 10) << 20 : 0;
            r->sm_limit[d] = sm && atoi(sm) > 0 ? (uint64_t)atoi(sm) : 100;
        }
        r->priority = 1;
        r->utilization_switch = 1;
        r->last_kernel_time = (uint64_t)time(0);
        r->initialized_flag = VGPU_REGION_MAGIC;
    }
    lock();
    {
        int i, took = 0;
        for (i = 0; i < r->proc_num && !took; i++)
            if (r->procs[i].pid == getpid()) { /* its own pid: taken over in place */
                fill(&r->procs[i]);
                took = 1;
            }
        if (!took) {
            compact(0);
            fill(&r->procs[r->proc_num]);
            r->proc_num++;
        }
    }
    unlock();
    return 0;
}

static uint64_t sum(int d)
{
    uint64_t s = 0;
    int i;
    for (i = 0; i < r->proc_num && i < VGPU_MAX_PROCS; i++)
        if (r->procs[i].status)
            s += r->procs[i].used[d].total;
    return s;
}

static void msleep(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, 0);
}

static int step(char *s)
{
    int d = 0, n = 0;
    unsigned long long b = 0;

    if (!strcmp(s, "attach")) {
        printf("attach %s\n", attach() == 0 ? "ok" : "failed");
    } else if (sscanf(s, "reserve:%d:%llu", &d, &b) == 2) {
        vgpu_proc_slot_t *me;
        int ok;
        lock();
        me = mine();
        ok = me && (!r->limit[d] || sum(d) + b <= r->limit[d]);
        if (ok) {
            me->used[d].data_size += b;
            me->used[d].total += b;
        }
        unlock();
        printf("reserve %s\n", ok ? "ok" : "refused");
    } else if (sscanf(s, "used:%d", &d) == 1) {
        printf("used %llu\n", (unsigned long long)sum(d));
    } else if (!strcmp(s, "slot")) {
        vgpu_proc_slot_t *me = mine();
        printf("slot %ld\n", me ? (long)(me - r->procs) : -1L);
    } else if (!strcmp(s, "procnum")) {
        printf("procnum %d\n", r->proc_num);
    } else if (!strcmp(s, "wait")) {
        char line[64];
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            line[0] = 0;
        printf("woke\n");
    } else if (!strcmp(s, "kill")) {
        fflush(stdout);
        raise(SIGKILL);
    } else if (!strcmp(s, "exit")) {
        lock();
        compact(1);
        unlock();
        printf("exit ok\n");
        fflush(stdout);
        _exit(0);
    } else if (sscanf(s, "launch:%d:%d", &n, &d) == 2) {
        long long held = 0;
        int i;
        for (i = 0; i < n; i++) {
            while (r->recent_kernel < 0) {
                msleep(10);
                held += 10;
            }
            if (time(0) != last_stamp) {
                last_stamp = time(0);
                r->last_kernel_time = (uint64_t)last_stamp;
            }
            msleep(d);
        }
        printf("launched %d held_ms %lld\n", n, held);
    } else if (!strncmp(s, "spawn:", 6)) {
        char *args[64], *save = 0, *t;
        int k = 0, st;
        pid_t pid;
        for (t = strtok_r(s + 6, ";", &save); t && k < 63; t = strtok_r(0, ";", &save))
            args[k++] = t;
        args[k] = 0;
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            execv(args[0], args);
            _exit(127);
        }
        waitpid(pid, &st, 0);
        printf("spawn exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        fprintf(stderr, "vendor_double: unknown step '%s'\n", s);
        return 1;
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    int i;
    setvbuf(stdout, 0, _IOLBF, 0);
    for (i = 1; i < argc; i++)
        if (step(argv[i]))
            return 1;
    return 0;
}
