/* The region's cross-process lock: a mutex between our own threads, then flock(2) on the region
 * file between processes.
 *
 * Why flock and not the region's sem_t: the kernel drops a flock when its holder dies (SIGKILL,
 * OOM kill, crash), so a dead holder never blocks the others; a process-shared semaphore stays
 * taken forever and needs a timeout-and-guess recovery. The sem_t fields are still initialised by
 * the creator for vendor peers (shm.c). flock belongs to an open file description, so a forked
 * child must open its own (shm.c reopens it) or it would share the parent's lock. */
#include <errno.h>
#include <pthread.h>
#include <sys/file.h>
#include <time.h>

#include "log/log.h"
#include "region/region.h"

/* a live holder keeps the lock for microseconds; past this it is stopped or stuck */
#define LOCK_TIMEOUT_NS (5ull * 1000 * 1000 * 1000)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int lock_fd = -1;
static int locked_file; /* 1 while we hold the flock (mu held) */
static int warned_timeout;

VGPU_HIDDEN void vgpu_region_lock_set_fd(int fd)
{
    lock_fd = fd;
}

/* the child of a fork gets a copy of `mu` in whatever state another thread left it */
VGPU_HIDDEN void vgpu_region_lock_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    locked_file = 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int try_flock(void)
{
    int rc;
    do
        rc = flock(lock_fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : (errno == EWOULDBLOCK ? 1 : -1);
}

/* Poll with exponential backoff (20 us .. 2 ms) rather than block: a blocking flock cannot time
 * out without signals, and we must not hang an application behind a stopped peer. */
static int do_lock(void)
{
    uint64_t deadline = 0, sleep_ns = 20000;
    int rc;

    while ((rc = try_flock()) == 1) {
        struct timespec ts;
        uint64_t now = now_ns();
        if (!deadline)
            deadline = now + LOCK_TIMEOUT_NS;
        else if (now >= deadline)
            return 1;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)sleep_ns;
        nanosleep(&ts, 0);
        if (sleep_ns < 2000000)
            sleep_ns *= 2;
    }
    return rc;
}

VGPU_HIDDEN int vgpu_region_lock(void)
{
    int rc;

    pthread_mutex_lock(&mu);
    if (lock_fd < 0)
        return 1;
    rc = do_lock();
    if (rc == 0) {
        locked_file = 1;
        return 0;
    }
    if (!__atomic_exchange_n(&warned_timeout, 1, __ATOMIC_RELAXED))
        VGPU_WARN("region lock not obtained within %llu s (%s); a peer holding it is stopped or stuck; "
                  "continuing without it, limits may be exceeded by concurrent allocations",
                  LOCK_TIMEOUT_NS / 1000000000ull, rc == 1 ? "busy" : "flock failed");
    return 1;
}

VGPU_HIDDEN void vgpu_region_unlock(void)
{
    if (locked_file) {
        locked_file = 0;
        flock(lock_fd, LOCK_UN);
    }
    pthread_mutex_unlock(&mu);
}
