/* === BOARD: which contexts are busy on a GPU, node-wide, so a limiter can tell its kernels'
 * GPU time from the time slices the GPU gave to other contexts meanwhile.
 *
 * Without MPS the GPU time-slices between contexts. A kernel longer than a slice is stretched by
 * every other busy context (an H200 measured 2.18 ms alone, 4.63 ms beside one busy context,
 * 6.90 ms beside two), so its event-measured time is not what it used. The limiter divides by
 * the number of contexts busy meanwhile, read here (limiter.c says how it guards against counting
 * too many).
 *
 * One small file per GPU in a directory every container of the node shares: HAMi mounts the host's
 * /tmp/vgpulock into each of them; VGPU_NODE_DIR names another (empty: no board). Each process
 * that launches on the GPU holds one 64-byte entry: its current busy stretch (since, busy_until)
 * and the last PAST stretches before it, so a reader can tell how long a neighbour was busy
 * between two moments, not only whether it is busy now (a throttled neighbour runs in bursts
 * between sleeps, and two looks at the board miss the burst in between). It extends the stretch,
 * at most once a millisecond, to "now + BUSY_NS" after a launch; a thread that waits for the GPU
 * (cuCtxSynchronize, cuStreamSynchronize: its process has work queued) holds it until it returns;
 * and a process that measures its launches (an SM limit) extends it to when its queued work should
 * be done. A stretch that had ended before the next mark is kept in the history and a new one
 * begins. Entries are claimed by CAS and freed at exit (the history stays true: the stretch ends
 * then); one whose process died simply stops being busy and is taken over after STALE_NS. No lock
 * between processes, no thread, no driver call on the way. A process's entry is alive while it
 * holds an OFD lock on the entry's byte past the end of the file (the kernel drops it when the
 * process dies): a dead process's entry is not counted at all (its mark may reach seconds ahead,
 * one killed inside a 10 s wait, say); the probe is one fcntl per entry, at most every 100 ms.
 *
 * The file is shared by every container, so it is mode 0666 and its content untrusted: a symlink,
 * a non-regular file, a file of another size or without our magic is not used; a busy mark further
 * than HOLD_NS in the future is ignored, busy time is clamped to the interval asked about, and
 * callers cap what they make of it. Unusable board: every process counts as alone (its measured
 * time is charged in full, as before there was a board). An entry of an older build (no history:
 * `since` 0) counts as busy over the whole interval when it is busy at its end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "limiter/board.h"
#include "log/log.h"

#define ENTRIES 63 /* and one header */
#define BUSY_NS 10000000ll     /* a launch marks its process busy for 10 ms */
#define HOLD_NS 10000000000ll  /* a thread waiting for the GPU holds the mark for up to 10 s */
#define MARK_EVERY_NS 1000000ll
#define STALE_NS 10000000000ll /* an entry idle for 10 s may be taken over */
#define LIVENESS_EVERY_NS 100000000ll
#define PAST 4 /* earlier busy stretches kept in an entry */
#define KEEP_NS 1000000000ll /* an entry freed this recently is taken last: its history is still read */
#define BOARD_MAGIC 0x766770752d62726full
#define DEFAULT_DIR "/tmp/vgpulock"

typedef struct {
    uint64_t owner;      /* a random word per process image; 0 = free (in the header: BOARD_MAGIC) */
    int64_t busy_until;  /* CLOCK_MONOTONIC ns: the end of the current stretch */
    int32_t pid;         /* for people reading the file */
    uint32_t seq;        /* odd while the owner rewrites the stretch and its history */
    int64_t since;       /* the current stretch's start; 0: an older build's entry, no history */
    uint32_t past[PAST][2]; /* earlier stretches, newest first: start and end in microseconds of the
                             * same clock, modulo 2^32 (71 minutes); {0, 0}: none */
} entry_t;
_Static_assert(sizeof(entry_t) == 64, "one cache line an entry");
#define BOARD_SIZE (sizeof(entry_t) * (ENTRIES + 1))

static struct board {
    pthread_mutex_t mu;
    pthread_mutex_t wmu; /* our threads rewrite our entry one at a time */
    int state;        /* 0 not tried, 1 open, -1 unusable */
    entry_t *all;     /* [0] is the header */
    entry_t *mine;
    int64_t marked;   /* our last busy mark */
    int waiting;      /* threads inside a wait for the GPU */
    int fd;           /* holds our entry's liveness lock; never mapped */
    char path[512];
    int64_t checked[ENTRIES + 1]; /* when each entry's liveness was last probed */
    char dead[ENTRIES + 1];       /* what that probe said */
} boards[VGPU_MAX_DEVICES];
static uint64_t nonce;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* the coarse clock for cheap looks (a tick behind at most), the precise one for what is stored */
static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int64_t fine_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static uint32_t us32(int64_t ns)
{
    return (uint32_t)(uint64_t)(ns / 1000);
}

/* ---- our entry: writes bracketed by seq (odd meanwhile), our threads one at a time ---- */

static uint32_t write_begin(entry_t *e)
{
    uint32_t s = __atomic_load_n(&e->seq, __ATOMIC_RELAXED) | 1u; /* odd even if a dead owner left it so */
    __atomic_store_n(&e->seq, s, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return s;
}

static void write_end(entry_t *e, uint32_t s)
{
    __atomic_store_n(&e->seq, s + 1, __ATOMIC_RELEASE);
}

/* a fresh entry: idle, no history (claim) */
static void fresh_entry(entry_t *e, int64_t now)
{
    uint32_t s = write_begin(e);
    int i;
    for (i = 0; i < PAST; i++) {
        __atomic_store_n(&e->past[i][0], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&e->past[i][1], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&e->since, now, __ATOMIC_RELAXED);
    __atomic_store_n(&e->busy_until, now, __ATOMIC_RELAXED);
    write_end(e, s);
}

/* wmu held: our busy stretch now ends at `until` (>= now). One that had ended before now goes
 * into the history (unless empty) and a new one begins now. */
static void stretch_locked(entry_t *e, int64_t now, int64_t until)
{
    uint32_t s = write_begin(e);
    int64_t end = __atomic_load_n(&e->busy_until, __ATOMIC_RELAXED);
    int64_t since = __atomic_load_n(&e->since, __ATOMIC_RELAXED);
    int i, j;

    if (end < now) {
        if (since > 0 && end > since) {
            for (i = PAST - 1; i > 0; i--)
                for (j = 0; j < 2; j++)
                    __atomic_store_n(&e->past[i][j], __atomic_load_n(&e->past[i - 1][j], __ATOMIC_RELAXED),
                                     __ATOMIC_RELAXED);
            __atomic_store_n(&e->past[0][0], us32(since), __ATOMIC_RELAXED);
            __atomic_store_n(&e->past[0][1], us32(end), __ATOMIC_RELAXED);
        }
        __atomic_store_n(&e->since, now, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&e->busy_until, until, __ATOMIC_RELAXED);
    write_end(e, s);
}

static void stretch(struct board *b, int64_t now, int64_t until)
{
    pthread_mutex_lock(&b->wmu);
    stretch_locked(b->mine, now, until);
    pthread_mutex_unlock(&b->wmu);
}

static void new_nonce(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    nonce = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uintptr_t)&ts;
    if (!nonce || nonce == BOARD_MAGIC)
        nonce = 1;
}

/* at exit: our stretch ends now (its history stays true for readers), and the entry is free */
static void release_all(void)
{
    int d, tries;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        struct board *b = &boards[d];
        entry_t *e = b->mine;
        uint64_t me = nonce;
        int64_t now = fine_ns();
        if (!e)
            continue;
        for (tries = 0; tries < 1000 && pthread_mutex_trylock(&b->wmu) != 0; tries++)
            sched_yield(); /* a thread of ours is writing it (a few stores); never wait for good at exit */
        if (tries < 1000) {
            if (__atomic_load_n(&e->busy_until, __ATOMIC_RELAXED) > now)
                stretch_locked(e, now, now);
            pthread_mutex_unlock(&b->wmu);
        }
        __atomic_compare_exchange_n(&e->owner, &me, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    }
}

/* a fork child is another process: its own entries, found again on its first launch */
static void atfork_child(void)
{
    int d;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    new_nonce();
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        boards[d].mu = fresh;
        boards[d].wmu = fresh;
        boards[d].mine = 0;
        boards[d].marked = 0;
        boards[d].waiting = 0;
        if (boards[d].fd >= 0)
            close(boards[d].fd); /* the parent's description: its lock stays the parent's */
        boards[d].fd = -1;
        if (boards[d].state > 0)
            boards[d].state = 0; /* the mapping is inherited; claim a new entry in it */
    }
}

static void init(void)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        pthread_mutex_init(&boards[d].mu, 0);
        pthread_mutex_init(&boards[d].wmu, 0);
        boards[d].fd = -1;
    }
    new_nonce();
    pthread_atfork(0, 0, atfork_child);
    atexit(release_all);
}

static entry_t *map_board(const char *path, int *keep_fd)
{
    struct stat st;
    entry_t *m;
    uint64_t zero = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);

    if (fd < 0) {
        VGPU_INFO("no GPU activity board at %s (%s): kernels are charged as if this process were alone", path,
                  strerror(errno));
        return 0;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_size != 0 && st.st_size != (off_t)BOARD_SIZE)) {
        VGPU_WARN("ignoring the GPU activity board %s: not a regular file of %zu bytes", path, BOARD_SIZE);
        close(fd);
        return 0;
    }
    if (st.st_uid == geteuid() && (st.st_mode & 0777) != 0666)
        (void)fchmod(fd, 0666); /* every container's processes join it, whatever their uid */
    /* allocated, not sparse: a full disk is found now, not as SIGBUS on a later store */
    if (st.st_size == 0 && posix_fallocate(fd, 0, (off_t)BOARD_SIZE) != 0) {
        close(fd);
        return 0;
    }
    m = mmap(0, BOARD_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return 0;
    *keep_fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK); /* for the locks, never mapped */
    __atomic_compare_exchange_n(&m[0].owner, &zero, BOARD_MAGIC, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&m[0].owner, __ATOMIC_ACQUIRE) != BOARD_MAGIC) {
        VGPU_WARN("ignoring the GPU activity board %s: not written by vgpu-patch", path);
        munmap(m, BOARD_SIZE);
        return 0;
    }
    return m;
}

/* an entry's liveness lock: one byte past the board's end, an OFD lock (dropped by the kernel when its
 * holder dies). take: 0 taken (or no OFD locks here), -1 a living process holds it. probe: 1 someone
 * holds it, 0 nobody does (its owner is gone), -1 cannot tell (then the owner counts as alive). */
static int live_lock(int fd, int i, short type, int probe)
{
    struct flock l;

    memset(&l, 0, sizeof l);
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_start = (off_t)(BOARD_SIZE + (size_t)i);
    l.l_len = 1;
    if (fcntl(fd, probe ? F_OFD_GETLK : F_OFD_SETLK, &l) != 0)
        return probe ? -1 : (errno == EAGAIN || errno == EACCES) ? -1 : 0;
    return probe ? l.l_type != F_UNLCK : 0;
}

/* a free entry, or a stale one (its owner idle for STALE_NS, or its mark absurd) whose owner is gone;
 * one freed in the last KEEP_NS only when nothing else is left: its history may still be read */
static entry_t *claim(struct board *b, int64_t now)
{
    int i, pass;
    for (pass = 0; pass < 2; pass++)
        for (i = 1; i <= ENTRIES; i++) {
            entry_t *e = &b->all[i];
            uint64_t seen = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
            int64_t busy = __atomic_load_n(&e->busy_until, __ATOMIC_RELAXED);
            if (seen == 0 && !pass && busy > now - KEEP_NS && busy <= now)
                continue;
            if ((seen == 0 || busy < now - STALE_NS || busy > now + STALE_NS) &&
                (b->fd < 0 || live_lock(b->fd, i, F_WRLCK, 0) == 0) && /* held by the living: not stale */
                __atomic_compare_exchange_n(&e->owner, &seen, nonce, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                e->pid = (int32_t)getpid();
                fresh_entry(e, now);
                return e;
            }
            if (b->fd >= 0)
                live_lock(b->fd, i, F_UNLCK, 0);
        }
    return 0;
}

static void open_board(struct board *b, int dev, const char *key)
{
    const char *dir = getenv("VGPU_NODE_DIR");
    char clean[100];
    size_t i, n = 0;

    b->state = -1;
    if (!dir)
        dir = DEFAULT_DIR;
    if (!*dir || !key || !*key)
        return;
    for (i = 0; key[i] && n + 1 < sizeof clean; i++) /* a UUID; anything else is kept out of the path */
        clean[n++] = ((key[i] >= 'a' && key[i] <= 'z') || (key[i] >= 'A' && key[i] <= 'Z') ||
                      (key[i] >= '0' && key[i] <= '9') || key[i] == '-') ? key[i] : '_';
    clean[n] = 0;
    snprintf(b->path, sizeof b->path, "%s/vgpu-patch-activity-%s", dir, clean);
    if (!(b->all = map_board(b->path, &b->fd)))
        return;
    if (!(b->mine = claim(b, fine_ns()))) {
        VGPU_INFO("GPU activity board %s is full: device %d's kernels are charged as if alone", b->path, dev);
        return; /* the mapping stays: we can still read the others */
    }
    b->state = 1;
}

VGPU_HIDDEN int vgpu_board_join(int dev, const char *key)
{
    struct board *b;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES)
        return -1;
    pthread_once(&init_once, init);
    b = &boards[dev];
    if (VGPU_LIKELY(__atomic_load_n(&b->state, __ATOMIC_ACQUIRE)))
        return b->state > 0 ? 0 : -1;
    pthread_mutex_lock(&b->mu);
    if (!b->state) {
        if (b->all && !b->mine) { /* a fork child: the mapping is ours already, its own lock is not */
            b->fd = open(b->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            b->state = (b->mine = claim(b, fine_ns())) ? 1 : -1;
        }
        else
            open_board(b, dev, key);
    }
    pthread_mutex_unlock(&b->mu);
    return b->state > 0 ? 0 : -1;
}

VGPU_HIDDEN int vgpu_board_state(int dev)
{
    return (dev < 0 || dev >= VGPU_MAX_DEVICES) ? -1 : __atomic_load_n(&boards[dev].state, __ATOMIC_ACQUIRE);
}

VGPU_HIDDEN void vgpu_board_mark(int dev)
{
    struct board *b = &boards[dev];
    int64_t now;

    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) <= 0)
        return;
    now = mono_ns();
    if (now - __atomic_load_n(&b->marked, __ATOMIC_RELAXED) < MARK_EVERY_NS)
        return;
    __atomic_store_n(&b->marked, now, __ATOMIC_RELAXED);
    now = fine_ns();
    if (!__atomic_load_n(&b->waiting, __ATOMIC_RELAXED) &&
        now + BUSY_NS > __atomic_load_n(&b->mine->busy_until, __ATOMIC_RELAXED))
        stretch(b, now, now + BUSY_NS);
}

VGPU_HIDDEN void vgpu_board_until(int dev, int64_t until)
{
    struct board *b = &boards[dev];
    int64_t now = fine_ns();

    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) <= 0 || __atomic_load_n(&b->waiting, __ATOMIC_RELAXED))
        return;
    if (until > now + HOLD_NS)
        until = now + HOLD_NS;
    if (until > __atomic_load_n(&b->mine->busy_until, __ATOMIC_RELAXED) + MARK_EVERY_NS)
        stretch(b, now, until);
}

VGPU_HIDDEN void vgpu_board_hold(int dev)
{
    struct board *b = &boards[dev];
    int64_t now;

    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) <= 0)
        return;
    __atomic_fetch_add(&b->waiting, 1, __ATOMIC_RELAXED);
    now = fine_ns();
    stretch(b, now, now + HOLD_NS);
}

VGPU_HIDDEN void vgpu_board_release(int dev)
{
    struct board *b = &boards[dev];

    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) <= 0)
        return;
    if (__atomic_sub_fetch(&b->waiting, 1, __ATOMIC_RELAXED) <= 0) { /* the queue is drained */
        int64_t now = fine_ns();
        __atomic_store_n(&b->waiting, 0, __ATOMIC_RELAXED);
        stretch(b, now, now);
    }
}

/* its owner died (nobody holds its liveness lock): probed at most every LIVENESS_EVERY_NS */
static int entry_dead(struct board *b, int i, int64_t now)
{
    if (b->fd >= 0 && now - b->checked[i] > LIVENESS_EVERY_NS) {
        b->dead[i] = live_lock(b->fd, i, F_WRLCK, 1) == 0;
        b->checked[i] = now;
    }
    return b->dead[i];
}

/* a mark this far ahead was not written by us: ignored */
static int absurd(int64_t busy, int64_t now)
{
    return busy > now + HOLD_NS + MARK_EVERY_NS;
}

VGPU_HIDDEN int vgpu_board_others(int dev)
{
    struct board *b;
    int64_t now;
    int i, n = 0;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || __atomic_load_n(&boards[dev].state, __ATOMIC_ACQUIRE) <= 0)
        return 0;
    b = &boards[dev];
    now = mono_ns();
    for (i = 1; i <= ENTRIES; i++) {
        entry_t *e = &b->all[i];
        int64_t busy;
        if (e == b->mine || !__atomic_load_n(&e->owner, __ATOMIC_RELAXED))
            continue;
        busy = __atomic_load_n(&e->busy_until, __ATOMIC_RELAXED);
        if (busy <= now || absurd(busy, now))
            continue;
        n += !entry_dead(b, i, now);
    }
    return n;
}

static int64_t overlap(int64_t a, int64_t z, int64_t t0, int64_t t1)
{
    int64_t lo = a > t0 ? a : t0, hi = z < t1 ? z : t1;
    return hi > lo ? hi - lo : 0;
}

/* how long entry e's owner was busy within [t0, t1] (t1 <= now), by its stretches; -1 when it has
 * no history (an older build's entry) or is being rewritten */
static int64_t busy_within(const entry_t *e, int64_t t0, int64_t t1, int64_t now)
{
    uint32_t s1 = 1, s2 = 0, past[PAST][2], base;
    int64_t since = 0, until = 0, sum, a, z;
    int tries, i;

    for (tries = 0; tries < 4 && (s1 != s2 || (s1 & 1u)); tries++) {
        s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
        since = __atomic_load_n(&e->since, __ATOMIC_RELAXED);
        until = __atomic_load_n(&e->busy_until, __ATOMIC_RELAXED);
        for (i = 0; i < PAST; i++) {
            past[i][0] = __atomic_load_n(&e->past[i][0], __ATOMIC_RELAXED);
            past[i][1] = __atomic_load_n(&e->past[i][1], __ATOMIC_RELAXED);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
    }
    if (s1 != s2 || (s1 & 1u) || since <= 0 || since > now || absurd(until, now))
        return -1;
    sum = overlap(since, until < now ? until : now, t0, t1); /* the rest of the stretch is a promise */
    base = us32(since);
    for (i = 0; i < PAST && (past[i][0] || past[i][1]); i++) {
        a = since - (int64_t)(uint32_t)(base - past[i][0]) * 1000;
        z = since - (int64_t)(uint32_t)(base - past[i][1]) * 1000;
        if (z <= t0)
            break; /* older stretches ended earlier still */
        sum += overlap(a, z, t0, t1);
    }
    return sum < t1 - t0 ? sum : t1 - t0;
}

VGPU_HIDDEN int64_t vgpu_board_busy(int dev, int64_t t0, int64_t t1)
{
    struct board *b;
    int64_t now, sum = 0, v, until;
    uint64_t owner;
    int i;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES || __atomic_load_n(&boards[dev].state, __ATOMIC_ACQUIRE) <= 0)
        return 0;
    b = &boards[dev];
    now = fine_ns();
    if (t1 > now)
        t1 = now;
    if (t0 >= t1)
        return 0;
    for (i = 1; i <= ENTRIES; i++) {
        entry_t *e = &b->all[i];
        if (e == b->mine)
            continue;
        owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
        if (owner && entry_dead(b, i, now))
            continue; /* died: when, nobody can tell, and its last mark may reach far ahead */
        v = busy_within(e, t0, t1, now); /* a freed entry's history is still true */
        if (v < 0) { /* no history: busy at the end counts for the whole interval */
            until = __atomic_load_n(&e->busy_until, __ATOMIC_RELAXED);
            v = owner && until > now && !absurd(until, now) ? t1 - t0 : 0;
        }
        sum += v;
    }
    return sum;
}
