/* The region's cross-process lock: a mutex between our own threads, then an open-file-description
 * write lock (fcntl F_OFD_SETLK) on one byte of the region file, LOCK_OFF, far past its end.
 *
 * Why this lock and not the alternatives:
 * - the region's sem_t stays taken forever when its holder dies; the kernel drops an OFD lock when
 *   the last descriptor of its holder is closed, which process death does (the sem_t fields are
 *   still initialised by the creator for vendor peers, shm.c);
 * - flock(2) can be taken on a read-only descriptor, so any reader of the file (or `flock(1)` on
 *   it) could hold it; an F_WRLCK needs a descriptor opened for writing, and fcntl locks and flock
 *   locks never conflict on Linux;
 * - both flock and OFD locks belong to the open file description, which fork shares: the child
 *   closes its copy at once (vgpu_region_lock_atfork_child), so it can never keep a lock its parent
 *   held when it was killed; exec closes it (O_CLOEXEC).
 * Kernels without OFD locks (< 3.15): flock on the same descriptor.
 *
 * A holder keeps the lock for microseconds (claim a slot, reap dead peers; never across a driver
 * call). Waiting: spin-yield first, then sleep in steps of at most 200 us, up to LOCK_TIMEOUT_NS.
 * A read lock on that byte is no peer's (ours are write locks; any reader of the file can take
 * one): it is given up on at once, not waited for. A timeout (a stopped holder) is said once; after it every later attempt
 * waits at most DEGRADED_TIMEOUT_NS until one succeeds, so a stall never costs seconds per
 * operation. Nothing depends on the lock for the limit itself (slots.c: claim-then-sum). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "log/log.h"
#include "region/region.h"

#ifndef F_OFD_SETLK
#define F_OFD_SETLK 37
#endif
#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#endif

#define LOCK_OFF (1ll << 40)
#define LOCK_TIMEOUT_NS (1000ull * 1000 * 1000)
#define DEGRADED_TIMEOUT_NS (2ull * 1000 * 1000)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int lock_fd = -1;
static int locked_file; /* 1 while we hold the file lock (mu held) */
static int use_flock;   /* no OFD locks in this kernel */
static int degraded;    /* the last attempt timed out */
static int warned_timeout;

VGPU_HIDDEN void vgpu_region_lock_set_fd(int fd)
{
    lock_fd = fd;
}

VGPU_HIDDEN int vgpu_region_lock_fd(void)
{
    return lock_fd;
}

/* the child of a fork: a fresh mutex, and never the parent's open file description */
VGPU_HIDDEN void vgpu_region_lock_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    locked_file = 0;
    degraded = 0;
    if (lock_fd >= 0)
        close(lock_fd); /* our copy only: the parent's lock (and liveness byte) stay the parent's */
    lock_fd = -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lock_range(struct flock *fl, short type)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)LOCK_OFF;
    fl->l_len = 1;
}

/* 0 taken, 1 busy, -1 error */
static int try_lock(void)
{
    struct flock fl;
    int rc;

    if (!use_flock) {
        lock_range(&fl, F_WRLCK);
        do
            rc = fcntl(lock_fd, F_OFD_SETLK, &fl);
        while (rc != 0 && errno == EINTR);
        if (rc == 0)
            return 0;
        if (errno == EAGAIN || errno == EACCES)
            return 1;
        if (errno != EINVAL)
            return -1;
        use_flock = 1; /* no OFD locks here */
    }
    do
        rc = flock(lock_fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : (errno == EWOULDBLOCK ? 1 : -1);
}

/* the byte is read-locked: by a reader of the file, never by a peer of ours */
static int read_locked(void)
{
    struct flock fl;

    if (use_flock)
        return 0;
    lock_range(&fl, F_WRLCK);
    return fcntl(lock_fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_RDLCK;
}

/* 0 taken, 1 timed out, 2 read-locked by a non-peer, -1 error */
static int do_lock(uint64_t timeout_ns)
{
    uint64_t deadline = 0, sleep_ns = 10000;
    int rc, spins = 0;

    while ((rc = try_lock()) == 1) {
        struct timespec ts;
        uint64_t now;

        if (spins++ < 20) { /* the holder is usually done within microseconds */
            sched_yield();
            continue;
        }
        now = now_ns();
        if (!deadline && read_locked())
            return 2;
        if (!deadline)
            deadline = now + timeout_ns;
        else if (now >= deadline)
            return 1;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)sleep_ns;
        nanosleep(&ts, 0);
        if (sleep_ns < 200000)
            sleep_ns *= 2;
    }
    return rc;
}

static int lock_with(uint64_t timeout_ns)
{
    int rc;

    pthread_mutex_lock(&mu);
    if (lock_fd < 0)
        return 1;
    rc = do_lock(__atomic_load_n(&degraded, __ATOMIC_RELAXED) ? DEGRADED_TIMEOUT_NS : timeout_ns);
    if (rc == 0) {
        locked_file = 1;
        __atomic_store_n(&degraded, 0, __ATOMIC_RELAXED);
        return 0;
    }
    if (timeout_ns)
        __atomic_store_n(&degraded, 1, __ATOMIC_RELAXED);
    if (timeout_ns && !__atomic_exchange_n(&warned_timeout, 1, __ATOMIC_RELAXED))
        VGPU_WARN("region lock not obtained within %llu ms (%s); a peer holding it is stopped or stuck; "
                  "continuing without it (later attempts wait at most %llu ms)", LOCK_TIMEOUT_NS / 1000000ull,
                  rc == 1 ? "busy" : rc == 2 ? "read-locked by a reader of the file" : "lock failed",
                  DEGRADED_TIMEOUT_NS / 1000000ull);
    return 1;
}

VGPU_HIDDEN int vgpu_region_lock(void)
{
    return lock_with(LOCK_TIMEOUT_NS);
}

/* one attempt, no wait: 0 held (call unlock), 1 not held (call unlock too: the mutex is held) */
VGPU_HIDDEN int vgpu_region_trylock(void)
{
    int rc;

    pthread_mutex_lock(&mu);
    if (lock_fd < 0)
        return 1;
    rc = try_lock();
    locked_file = rc == 0;
    return rc == 0 ? 0 : 1;
}

VGPU_HIDDEN void vgpu_region_unlock(void)
{
    if (locked_file) {
        struct flock fl;
        locked_file = 0;
        if (use_flock) {
            flock(lock_fd, LOCK_UN);
        } else {
            lock_range(&fl, F_UNLCK);
            fcntl(lock_fd, F_OFD_SETLK, &fl);
        }
    }
    pthread_mutex_unlock(&mu);
}
