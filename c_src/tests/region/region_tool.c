/* Test driver for c_src/region (not part of the shim): runs its arguments as steps, one line of
 * output per step, so pytest can drive several real processes against one region file.
 *   offsets                 print every layout offset as JSON (pinned against vgpu_patch/region.py)
 *   attach                  attach with devices from VGPU_TEST_DEVICES (default 1) and limits from env
 *   reserve:D:N  release:D:N  used:D  limit:D  smlimit:D  slot  procnum
 *   wait                    block until a line (or EOF) arrives on stdin
 *   sleep:MS  kill (SIGKILL ourselves)  detach  fork:STEPS (run ';'-separated steps in a child, wait)
 *   exec:STEPS              replace this image with a fresh region_tool running STEPS (same pid)
 *   lockhold:MS             hold the region lock for MS milliseconds
 *   locktime                take and drop the region lock; prints rc and how long it took
 *   forksleep:MS            fork a child that sleeps MS ms without exec or any region use (not waited
 *                           for; "forked" once the child is running, its fork handlers done)
 *   dying                   the last moments of an exit: our descriptors (the liveness byte's) are
 *                           released, the main thread is done (a zombie leader), one thread is left
 *                           until a line arrives on stdin; prints "dying" (the last step)
 *   bench:N:BYTES           time N reserve+release pairs on device 0; prints ns per pair
 *   benchcas:N:BYTES        the same with a process-local CAS counter (the fallback's cost)
 */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

#define IN_FORCE(d) vgpu_limit_in_force(vgpu_region_stored_limit(d), vgpu_limits_env(d))

#define OFF(t, f) printf("\"%s.%s\": %zu,\n", #t, #f, offsetof(t, f))

static void print_offsets(void)
{
    printf("{\n");
    OFF(vgpu_device_memory_t, context_size); OFF(vgpu_device_memory_t, module_size);
    OFF(vgpu_device_memory_t, data_size); OFF(vgpu_device_memory_t, offset);
    OFF(vgpu_device_memory_t, total); OFF(vgpu_device_memory_t, unused);
    OFF(vgpu_device_util_t, dec_util); OFF(vgpu_device_util_t, enc_util);
    OFF(vgpu_device_util_t, sm_util); OFF(vgpu_device_util_t, unused);
    OFF(vgpu_proc_slot_t, pid); OFF(vgpu_proc_slot_t, hostpid); OFF(vgpu_proc_slot_t, used);
    OFF(vgpu_proc_slot_t, monitorused); OFF(vgpu_proc_slot_t, device_util); OFF(vgpu_proc_slot_t, status);
    OFF(vgpu_proc_slot_t, seqlock); OFF(vgpu_proc_slot_t, unused);
    OFF(vgpu_region_t, initialized_flag); OFF(vgpu_region_t, major_version);
    OFF(vgpu_region_t, minor_version); OFF(vgpu_region_t, sm_init_flag); OFF(vgpu_region_t, owner_pid);
    OFF(vgpu_region_t, sem); OFF(vgpu_region_t, device_num); OFF(vgpu_region_t, uuids);
    OFF(vgpu_region_t, limit); OFF(vgpu_region_t, sm_limit); OFF(vgpu_region_t, procs);
    OFF(vgpu_region_t, proc_num); OFF(vgpu_region_t, utilization_switch); OFF(vgpu_region_t, recent_kernel);
    OFF(vgpu_region_t, priority); OFF(vgpu_region_t, last_kernel_time); OFF(vgpu_region_t, sem_postinit);
    printf("\"sizeof.vgpu_device_memory_t\": %zu,\n\"sizeof.vgpu_device_util_t\": %zu,\n",
           sizeof(vgpu_device_memory_t), sizeof(vgpu_device_util_t));
    printf("\"ledger.offset\": %zu,\n\"ledger.check\": %llu,\n", offsetof(vgpu_region_t, procs) +
           VGPU_LEDGER_SLOT * sizeof(vgpu_proc_slot_t) + offsetof(vgpu_proc_slot_t, used),
           (unsigned long long)VGPU_LEDGER_CHECK);
    printf("\"sizeof.vgpu_proc_slot_t\": %zu,\n\"sizeof.vgpu_region_t\": %zu\n}\n", sizeof(vgpu_proc_slot_t),
           sizeof(vgpu_region_t));
}

static int attach(void)
{
    vgpu_region_config_t cfg;
    const char *nd = getenv("VGPU_TEST_DEVICES");
    int d;

    memset(&cfg, 0, sizeof cfg);
    cfg.device_count = nd ? atoi(nd) : 1;
    for (d = 0; d < cfg.device_count && d < VGPU_MAX_DEVICES; d++)
        snprintf(cfg.uuid[d], sizeof cfg.uuid[d], "GPU-00000000-0000-0000-0000-%012d", d);
    vgpu_region_config_from_env(&cfg);
    return vgpu_region_attach(0, &cfg);
}

static void msleep(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, 0);
}

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static uint64_t cas_used;

static int cas_reserve(uint64_t limit, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(&cas_used, __ATOMIC_RELAXED);
    do {
        if (bytes > limit || cur > limit - bytes)
            return -1;
    } while (!__atomic_compare_exchange_n(&cas_used, &cur, cur + bytes, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return 0;
}

static int step(char *s);

/* the last thread of a dying process: our descriptor goes first, as the kernel may release it
 * before the driver's; the process is gone once this thread ends */
static void *last_thread(void *arg)
{
    char line[64];

    (void)arg;
    close(vgpu_region_lock_fd());
    printf("dying\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        line[0] = 0;
    _exit(0);
}

static int run_steps(char *list)
{
    char *save = 0, *t;
    for (t = strtok_r(list, ";", &save); t; t = strtok_r(0, ";", &save))
        if (step(t))
            return 1;
    return 0;
}

static int step(char *s)
{
    int d = 0;
    unsigned long long n = 0;
    vgpu_region_t *r = vgpu_region_get();

    if (!strcmp(s, "offsets")) {
        print_offsets();
    } else if (!strcmp(s, "attach")) {
        printf("attach %s\n", attach() == 0 ? "ok" : "failed");
    } else if (sscanf(s, "reserve:%d:%llu", &d, &n) == 2) {
        int rc = vgpu_region_reserve(d, n, IN_FORCE(d));
        printf("reserve %s\n", rc == 0 ? "ok" : rc == -1 ? "refused" : "unattached");
    } else if (sscanf(s, "release:%d:%llu", &d, &n) == 2) {
        vgpu_region_release(d, n);
        printf("release ok\n");
    } else if (sscanf(s, "used:%d", &d) == 1) {
        printf("used %llu\n", r ? (unsigned long long)vgpu_region_sum_used(r, d) : 0ull);
    } else if (sscanf(s, "limit:%d", &d) == 1) {
        printf("limit %llu\n", r ? (unsigned long long)r->limit[d] : 0ull);
    } else if (sscanf(s, "smlimit:%d", &d) == 1) {
        printf("smlimit %llu\n", r ? (unsigned long long)r->sm_limit[d] : 0ull);
    } else if (!strcmp(s, "slot")) {
        vgpu_proc_slot_t *me = vgpu_region_self();
        printf("slot %ld\n", (me && r) ? (long)(me - r->procs) : -1L);
    } else if (!strcmp(s, "procnum")) {
        printf("procnum %d\n", r ? r->proc_num : -1);
    } else if (!strcmp(s, "wait")) {
        char line[64];
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            line[0] = 0;
        printf("woke\n");
    } else if (sscanf(s, "sleep:%d", &d) == 1) {
        msleep(d);
    } else if (sscanf(s, "lockhold:%d", &d) == 1) {
        vgpu_region_lock();
        printf("locked\n");
        fflush(stdout);
        msleep(d);
        vgpu_region_unlock();
    } else if (!strcmp(s, "locktime")) {
        long long t0 = mono_ns();
        int rc = vgpu_region_lock();
        vgpu_region_unlock();
        printf("lock rc=%d ms=%.1f\n", rc, (double)(mono_ns() - t0) / 1e6);
    } else if (sscanf(s, "forksleep:%d", &d) == 1) {
        int gate[2];
        char c = 0;
        fflush(stdout);
        if (pipe(gate) != 0)
            return 1;
        if (fork() == 0) { /* the fork handlers have run by now: say so, then just sleep */
            close(gate[0]);
            if (write(gate[1], &c, 1) != 1)
                _exit(1);
            close(gate[1]);
            msleep(d);
            _exit(0);
        }
        close(gate[1]);
        if (read(gate[0], &c, 1) != 1)
            return 1;
        close(gate[0]);
        printf("forked\n");
    } else if (sscanf(s, "bench:%d:%llu", &d, &n) == 2) {
        long long t0 = mono_ns();
        int i, bad = 0;
        for (i = 0; i < d; i++) {
            bad |= vgpu_region_reserve(0, n, IN_FORCE(0)) != 0;
            vgpu_region_release(0, n);
        }
        printf("bench ns=%.1f%s\n", (double)(mono_ns() - t0) / d, bad ? " refused" : "");
    } else if (sscanf(s, "benchcas:%d:%llu", &d, &n) == 2) {
        long long t0 = mono_ns();
        int i, bad = 0;
        for (i = 0; i < d; i++) {
            bad |= cas_reserve(1ull << 40, n) != 0;
            __atomic_fetch_sub(&cas_used, n, __ATOMIC_RELAXED);
        }
        printf("benchcas ns=%.1f%s\n", (double)(mono_ns() - t0) / d, bad ? " refused" : "");
    } else if (!strcmp(s, "dying")) {
        pthread_t t;
        fflush(stdout);
        if (pthread_create(&t, 0, last_thread, 0) != 0)
            return 1;
        pthread_exit(0); /* the main thread is done: the leader is a zombie while `t` lives */
    } else if (!strcmp(s, "kill")) {
        fflush(stdout);
        raise(SIGKILL);
    } else if (!strcmp(s, "detach")) {
        vgpu_region_detach();
        printf("detach ok\n");
    } else if (!strncmp(s, "exec:", 5)) {
        char *args[64], *save = 0, *t;
        int n = 0;
        args[n++] = "region_tool";
        for (t = strtok_r(s + 5, ";", &save); t && n < 63; t = strtok_r(0, ";", &save))
            args[n++] = t;
        args[n] = 0;
        fflush(stdout);
        execv("/proc/self/exe", args);
        printf("exec failed\n");
    } else if (!strncmp(s, "fork:", 5)) {
        pid_t pid;
        int st;
        fflush(stdout);
        pid = fork();
        if (pid == 0)
            _exit(run_steps(s + 5));
        waitpid(pid, &st, 0);
        printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        fprintf(stderr, "region_tool: unknown step '%s'\n", s);
        return 1;
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    int i;

    setvbuf(stdout, 0, _IOLBF, 0);
    vgpu_log_init_from_env();
    vgpu_limits_load_env();
    if (!vgpu_limits_valid()) {
        printf("limits invalid: %s\n", vgpu_limits_error());
        return 3;
    }
    for (i = 1; i < argc; i++)
        if (step(argv[i]))
            return 1;
    return 0;
}
