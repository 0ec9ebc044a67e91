/* === BOARD: which contexts are busy on a GPU, node-wide, so a limiter can tell its kernels'
 * GPU time from the time slices the GPU gave to other contexts meanwhile.
 *
 * Without MPS the GPU time-slices between contexts. A kernel longer than a slice is stretched by
 * every other busy context (an H200 measured 2.18 ms alone, 4.63 ms beside one busy context,
 * 6.90 ms beside two), so its event-measured time is not what it used. The limiter divides by
 * the number of contexts busy meanwhile, read here.
 *
 * One small file per GPU in a directory every container of the node shares: HAMi mounts the host's
 * /tmp/vgpulock into each of them; VGPU_NODE_DIR names another (empty: no board). Each process that
 * launches on the GPU writes one 64-byte entry: its current busy stretch (since, until) and `total`,
 * how long it was busy before that stretch since it took the entry, so its busy time up to any
 * moment is a running sum (the integral). A launch extends the stretch to "now + BUSY_NS" at most
 * once a millisecond; a thread that waits for the GPU (its process has work queued) holds it until
 * it returns; a process that measures its launches (an SM limit) extends it to when its queued work
 * should be done.
 *
 * Readers keep their own history. Each look at the board (vgpu_board_sample: at every harvest of
 * the limiter) adds up how much the others' running sums grew since the last look and keeps that
 * sum, with the time, in a private ring; how long the others were busy between two past moments is
 * then read from the ring, interpolated between looks. Nothing of the past lives in the shared
 * file, so a neighbour's history is never too short for a harvest that comes late (a throttled
 * container sleeping off its debt, a queue 100 ms deep): an in-file history of four stretches did
 * not reach back, a late tenant took its stretched kernel for one it ran alone and got 0.55 of its
 * share on the H200.
 *
 * The file is shared by every container on the GPU (mode 0666): any of them can truncate, zero,
 * junk or forge it at any moment (docs/architecture.md, the threat model). So:
 * - it is never mapped: readers pread() one private copy of the whole board and decide from it,
 *   the writer pwrite()s its whole entry; a truncated file reads short (those entries count as
 *   unreadable) and cannot fault (no SIGBUS);
 * - an entry is whoever holds its liveness lock: an OFD lock on the entry's byte past the end of
 *   the board, kept by the kernel while the owner lives and dropped when it dies, which no write to
 *   the file can take away; the writer rewrites its whole entry on every mark, so a zeroed or junk
 *   entry is mended within a millisecond of its owner's next launch; a tenant that holds every lock
 *   does not keep newcomers off: they use entries that show no use, without the lock, or, when NVML
 *   counts far fewer processes than locks are held, forged ones (forged_free); an owner whose entry
 *   is taken over moves, and readers follow its owner word from entry to entry; a process that finds
 *   no entry reads the others and tries again every RETRY_NS;
 * - an entry counts only when its checksum holds and its times make sense (a stretch ending more
 *   than HOLD_NS ahead, a running sum growing faster than the clock: not believed); a live owner's
 *   entry that reads as junk keeps the rate of growth last seen, and once readable again its real
 *   growth replaces the guess, so zeroing a neighbour's entry moves nobody's charges;
 * - growth is capped by the time between two looks, and the limiter caps what it makes of the sum
 *   by the GPU's own count of processes (NVML), which no file can forge;
 * - the file is created 0666 by O_EXCL and never chmod-ed after that; a file that is not regular,
 *   or has a second name (a hard link to something else), is not used.
 * Unusable board: every process counts as alone (its measured time is charged in full). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "limiter/board.h"
#include "log/log.h"

#define ENTRIES 63 /* and one header */
#define BUSY_NS 10000000ll     /* a launch marks its process busy for 10 ms */
#define HOLD_NS 10000000000ll  /* a thread waiting for the GPU holds the mark for up to 10 s */
#define MARK_EVERY_NS 1000000ll
#define LIVENESS_EVERY_NS 100000000ll
#define TAKEOVER_NS 1000000000ll /* a full board: an entry idle this long may be used without its lock */
#define RETRY_NS 100000000ll     /* a process without an entry tries again this often */
#define PROBE_NS 50000000ll      /* the least time over which an entry's growth tells use from a forgery */
#define SLACK 8                  /* lock holders beyond the GPU's own process count believed real */
#define SAMPLE_EVERY_NS 250000ll /* looks closer together than this add no sample */
#define HIST 512                 /* samples kept: at a harvest every 2 ms, a second of history */
#define MAX_OTHERS 8             /* no look counts more than this many others busy at once */
#define GONE 8                   /* owners whose entry was taken over, kept in case they turn up elsewhere */
#define GONE_NS 250000000ll      /* ... for this long, guessed busy at their last rate meanwhile */
#define BOARD_MAGIC 0x766770752d627232ull /* "vgpu-br2" */
#define ENTRY_MAGIC 0x9e3779b97f4a7c15ull /* folded into each entry's checksum */
#define DEFAULT_DIR "/tmp/vgpulock"
#define FILE_PREFIX "vgpu-patch-activity2-"

typedef struct {
    uint64_t owner; /* a random word per process image; 0 = free (in the header: BOARD_MAGIC) */
    int64_t since;  /* CLOCK_MONOTONIC ns: the current stretch's start */
    int64_t until;  /* its end; may lie ahead (a promise) */
    int64_t total;  /* ns busy before `since`, since `born` */
    int64_t born;   /* when the owner took the entry */
    int32_t pid;    /* for people reading the file */
    uint32_t tag;   /* the writer's container (vgpu_board_join), its top bit priority 0; builds before it wrote
                     * a rewrite count here */
    uint64_t freed; /* 1: its owner left; the running sum is final (readers still count its last growth) */
    uint64_t sum; /* checksum of the words above: a torn or junk entry does not count */
} entry_t;
_Static_assert(sizeof(entry_t) == 64, "one cache line an entry");
#define BOARD_SIZE (sizeof(entry_t) * (ENTRIES + 1))

/* what this reader last made of another entry */
struct seen {
    uint64_t owner;   /* 0: not followed */
    int64_t running;  /* its running sum then */
    int64_t at;       /* when that was read */
    int64_t guessed;  /* added since, at its last rate, while it read as junk */
    int64_t rate_ppm; /* its busy ns per million ns, lately */
    int64_t until;    /* the end of the stretch it last showed */
    uint32_t tag;     /* its container */
    int busy;         /* busy at the last look */
};

static struct board {
    pthread_mutex_t mu;  /* joining, and our entry's rewrites */
    pthread_mutex_t rmu; /* looks and the history */
    int state;           /* 0 not tried, 1 joined, -1 unusable */
    int dev;
    int (*procs)(int dev); /* the GPU's own count of processes with a context (NVML), us included; -1 unknown */
    int fd;              /* the board; our entry's liveness lock is on this description */
    int index;           /* atomic: our entry, 1..ENTRIES; 0: none yet (a full board: we only read) */
    int64_t retry_at;    /* atomic: without an entry, when to try for one again */
    int said_full;
    struct probe {               /* the board as a try for an entry found it full */
        entry_t copy[ENTRIES + 1];
        ssize_t n;
        int64_t at;              /* 0: none */
    } probe[2];                  /* two, so that one is always old enough to judge by (forged_free) */
    int locked;          /* we hold its liveness lock (else it was taken from a tenant holding every lock) */
    entry_t mine;        /* our entry as we last wrote it */
    int64_t marked;      /* our last busy mark */
    int waiting;         /* threads inside a wait for the GPU */
    char path[512];
    entry_t copy[ENTRIES + 1];    /* the last look's private copy of the board */
    struct seen seen[ENTRIES + 1];
    struct seen gone[GONE];       /* followed owners last seen at an entry someone else now shows */
    unsigned gone_head;
    int64_t checked[ENTRIES + 1]; /* when each entry's liveness was last probed */
    char dead[ENTRIES + 1];       /* what that probe said */
    int busy_now;                 /* others busy at the last look */
    int foreign_now;              /* ... of them, of other containers (another tag) */
    int high_now;                 /* ... of those, of high-priority ones (VGPU_BOARD_HIGH) */
    int64_t looked;               /* when the last look was */
    int64_t running;              /* the others' busy ns, added up over our looks */
    struct {
        int64_t t, busy;
    } hist[HIST]; /* [head - count, head) */
    unsigned head, count;
} boards[VGPU_MAX_DEVICES];
static uint64_t nonce;
static uint32_t my_tag; /* our container */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

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

static uint64_t checksum(const entry_t *e)
{
    const uint64_t *w = (const uint64_t *)e;
    uint64_t h = ENTRY_MAGIC;
    size_t i;

    for (i = 0; i < offsetof(entry_t, sum) / sizeof *w; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h | 1; /* never 0: an all-zero entry never checks */
}

/* ---- our entry ---- */

static int readable(const entry_t *e, int64_t now, int64_t *running);
static int find_entry(struct board *b, int64_t now);
static int live_lock(int fd, int i, short type, int probe);

/* mu held: an entry taken without its lock (find_entry) is ours until its lock holder writes a real entry
 * there; then we move. Its lock is taken as soon as nobody holds it. */
static void keep_unlocked(struct board *b)
{
    entry_t there;
    int64_t now = fine_ns(), running;
    int i;

    if (live_lock(b->fd, b->index, F_WRLCK, 0) == 0) {
        b->locked = 1;
        return;
    }
    if (pread(b->fd, &there, sizeof there, (off_t)(sizeof(entry_t) * (size_t)b->index)) == (ssize_t)sizeof there &&
        there.owner != nonce && !there.freed && readable(&there, now, &running)) {
        i = find_entry(b, now); /* our running sum moves with us */
        if (i <= 0) /* nowhere else: we only read until a try finds one (never write over a real entry) */
            __atomic_store_n(&b->retry_at, now + RETRY_NS, __ATOMIC_RELAXED);
        __atomic_store_n(&b->index, i > 0 ? i : 0, __ATOMIC_RELAXED);
    }
}

/* mu held: write our whole entry where it is */
static void write_mine(struct board *b)
{
    b->mine.sum = checksum(&b->mine);
    if (pwrite(b->fd, &b->mine, sizeof b->mine, (off_t)(sizeof(entry_t) * (size_t)b->index)) !=
        (ssize_t)sizeof b->mine) {
        /* a full disk or a file made read-only: the next mark tries again */
    }
}

/* mu held: write our whole entry (a zeroed or junk copy in the file is mended by it) */
static void put_mine(struct board *b)
{
    if (b->index && !b->locked)
        keep_unlocked(b);
    if (b->index) /* else no entry: nothing of ours is on the board */
        write_mine(b);
}

/* mu held: our busy stretch now ends at `until` (>= now); one that had ended before now is added
 * to the running sum and a new one begins now */
static void stretch_locked(struct board *b, int64_t now, int64_t until)
{
    entry_t *e = &b->mine;

    if (e->until < now) {
        if (e->until > e->since)
            e->total += e->until - e->since;
        e->since = now;
    }
    e->until = until;
    put_mine(b);
}

static int claim(struct board *b, int64_t now);

/* mu held: without an entry, try for one at most every RETRY_NS; 1 when we have one */
static int have_entry(struct board *b, int64_t now)
{
    if (b->index)
        return 1;
    if (now < b->retry_at)
        return 0;
    __atomic_store_n(&b->retry_at, now + RETRY_NS, __ATOMIC_RELAXED);
    return claim(b, now) == 0;
}

static void stretch(struct board *b, int64_t now, int64_t until)
{
    if (!__atomic_load_n(&b->index, __ATOMIC_RELAXED) && now < __atomic_load_n(&b->retry_at, __ATOMIC_RELAXED))
        return; /* we only read until the next try for an entry */
    pthread_mutex_lock(&b->mu);
    if (b->state > 0 && have_entry(b, now))
        stretch_locked(b, now, until);
    pthread_mutex_unlock(&b->mu);
}

static void new_nonce(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    nonce = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uintptr_t)&ts;
    if (!nonce || nonce == BOARD_MAGIC)
        nonce = 1;
}

/* at exit: our stretch ends now and the entry is free (the kernel drops the lock with the process); the
 * owner word stays, so a reader still counts what we did since its last look */
static void release_all(void)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        struct board *b = &boards[d];
        int64_t now = fine_ns();
        if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) <= 0 || pthread_mutex_trylock(&b->mu) != 0)
            continue; /* a thread of ours is writing it: never wait at exit */
        if (!b->index) {
            pthread_mutex_unlock(&b->mu);
            continue;
        }
        if (b->mine.until > now)
            b->mine.until = now;
        if (b->mine.until > b->mine.since)
            b->mine.total += b->mine.until - b->mine.since;
        b->mine.since = b->mine.until = now;
        b->mine.freed = 1;
        put_mine(b);
        pthread_mutex_unlock(&b->mu);
    }
}

/* a fork child is another process: its own entries, found again on its first launch */
static void atfork_child(void)
{
    int d;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    new_nonce();
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        struct board *b = &boards[d];
        b->mu = fresh;
        b->rmu = fresh;
        if (b->fd >= 0)
            close(b->fd); /* the parent's description: its lock stays the parent's */
        b->fd = -1;
        b->marked = 0;
        b->waiting = 0;
        b->looked = 0;
        b->count = 0;
        b->index = 0;
        b->retry_at = 0;
        b->probe[0].at = b->probe[1].at = 0;
        memset(b->seen, 0, sizeof b->seen);
        memset(b->gone, 0, sizeof b->gone);
        if (b->state > 0)
            b->state = 0; /* join again, with an entry of its own */
    }
}

static void init(void)
{
    int d;
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        pthread_mutex_init(&boards[d].mu, 0);
        pthread_mutex_init(&boards[d].rmu, 0);
        boards[d].fd = -1;
    }
    new_nonce();
    pthread_atfork(0, 0, atfork_child);
    atexit(release_all);
}

/* the board's file, created by the first process of the node (0666, allocated so a full disk shows
 * now), else opened as it is: a regular file of one name, never a symlink; -1 when unusable */
static int open_file(const char *path)
{
    struct stat st;
    entry_t head;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);

    if (fd >= 0) {
        memset(&head, 0, sizeof head);
        head.owner = BOARD_MAGIC;
        if (fchmod(fd, 0666) != 0 || posix_fallocate(fd, 0, (off_t)BOARD_SIZE) != 0 ||
            pwrite(fd, &head, sizeof head, 0) != (ssize_t)sizeof head) {
            unlink(path);
            close(fd);
            return -1;
        }
        return fd;
    }
    if (errno != EEXIST || (fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)) < 0) {
        VGPU_INFO("no GPU activity board at %s (%s): kernels are charged as if this process were alone", path,
                  strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        VGPU_WARN("ignoring the GPU activity board %s: not a regular file of one name; remove it", path);
        close(fd);
        return -1;
    }
    return fd;
}

/* an entry's liveness lock: one byte past the board's end, an OFD lock (dropped by the kernel when its
 * holder dies). take: 0 taken, -1 not (someone living holds it, or no OFD locks here). probe: 1 someone
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
        return -1;
    return probe ? l.l_type != F_UNLCK : 0;
}

/* mu held: every liveness lock is held, and the content under each shows use. When the GPU's own count of
 * processes (NVML, which no file can forge) is well below the board's 63, most holders have no context on
 * the GPU at all: a tenant filling the board, and an entry is taken without its lock, at random so that
 * newcomers spread out. Preferred: one whose running sum did not grow at all since an earlier copy of the
 * board (at least PROBE_NS old; two copies are kept, the newer replaced only once it is that old, so one is
 * always ready), which is no busy process's; else any (forged busy, as the count says most are). A real
 * owner whose entry we took writes it again at its next mark and we move on; a forger that overwrites ours
 * makes us move too, and readers follow our owner word (grew()). -1: none. */
static int forged_free(struct board *b, const entry_t *copy, ssize_t n, int64_t now)
{
    int cand[ENTRIES], nc = 0, i, procs = b->procs ? b->procs(b->dev) : -1;
    struct probe *old = b->probe[0].at <= b->probe[1].at ? &b->probe[0] : &b->probe[1];
    struct probe *young = old == &b->probe[0] ? &b->probe[1] : &b->probe[0], *p;
    int64_t then, running;
    uint64_t x;

    if (procs < 1 || procs + SLACK >= ENTRIES)
        return -1; /* unknown, or as many processes as entries: the holders may all be real */
    p = young->at && now - young->at >= PROBE_NS ? young : old->at && now - old->at >= PROBE_NS ? old : 0;
    if (p)
        for (i = 1; i <= ENTRIES; i++)
            if (i != b->index && (size_t)p->n >= sizeof(entry_t) * (size_t)(i + 1) &&
                (size_t)n >= sizeof(entry_t) * (size_t)(i + 1) && copy[i].owner == p->copy[i].owner &&
                readable(&p->copy[i], p->at, &then) && readable(&copy[i], now, &running) &&
                running == then)
                cand[nc++] = i;
    if (!young->at || now - young->at >= PROBE_NS) { /* the older one goes: the newer stays to judge by */
        memcpy(old->copy, copy, sizeof old->copy);
        old->n = n;
        old->at = now;
    }
    if (!nc) /* every entry grows: forged busy (the count says most are), so any of them, but never ours */
        for (i = 1; i <= ENTRIES; i++)
            if (i != b->index)
                cand[nc++] = i;
    x = nonce ^ (uint64_t)now;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return cand[x % (uint64_t)nc];
}

/* mu held: an entry for us. The first whose liveness lock nobody holds is ours, whatever the file says of
 * it. When someone holds every lock (a tenant filling the board, or 63 processes), one whose content shows
 * no use (junk, freed, or idle for TAKEOVER_NS) is taken without its lock, else one that forged_free()
 * shows to be a forgery's; put_mine() gives it up when its lock holder writes a real entry there again.
 * -1 when there is none. */
static int find_entry(struct board *b, int64_t now)
{
    entry_t copy[ENTRIES + 1];
    ssize_t n;
    int64_t running;
    int i, held = 0;

    for (i = 1; i <= ENTRIES; i++) {
        if (live_lock(b->fd, i, F_WRLCK, 0) == 0) {
            b->locked = 1;
            return i;
        }
        held += errno == EAGAIN || errno == EACCES; /* not: no OFD locks here */
    }
    n = pread(b->fd, copy, sizeof copy, 0);
    if (n < 0)
        n = 0;
    b->locked = 0;
    for (i = 1; i <= ENTRIES; i++)
        if (i != b->index && ((size_t)n < sizeof(entry_t) * (size_t)(i + 1) || !readable(&copy[i], now, &running) ||
                              copy[i].freed || copy[i].until < now - TAKEOVER_NS))
            return i;
    return held == ENTRIES ? forged_free(b, copy, n, now) : -1;
}

/* mu held: take an entry and write our fresh one there */
static int claim(struct board *b, int64_t now)
{
    int i = find_entry(b, now);

    if (i < 0)
        return -1;
    memset(&b->mine, 0, sizeof b->mine);
    b->mine.owner = nonce;
    b->mine.since = b->mine.until = b->mine.born = now;
    b->mine.pid = (int32_t)getpid();
    b->mine.tag = my_tag;
    __atomic_store_n(&b->index, i, __ATOMIC_RELAXED);
    write_mine(b); /* over what is there: find_entry() decided it is ours */
    return 0;
}

static void look_locked(struct board *b, int64_t now);

static void open_board(struct board *b, int dev, const char *key)
{
    int64_t now;
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
    if (!b->path[0])
        snprintf(b->path, sizeof b->path, "%s/" FILE_PREFIX "%s", dir, clean);
    if ((b->fd = open_file(b->path)) < 0)
        return;
    b->dev = dev;
    now = fine_ns();
    if (claim(b, now) != 0) { /* we read the others, and try again for an entry at our next launches */
        __atomic_store_n(&b->retry_at, now + RETRY_NS, __ATOMIC_RELAXED);
        if (!b->said_full++)
            VGPU_INFO("GPU activity board %s is full: device %d only reads it until an entry frees up", b->path,
                      dev);
    }
    pthread_mutex_lock(&b->rmu);
    look_locked(b, fine_ns()); /* the history starts at the join */
    pthread_mutex_unlock(&b->rmu);
    __atomic_store_n(&b->state, 1, __ATOMIC_RELEASE);
}

VGPU_HIDDEN int vgpu_board_join(int dev, const char *key, uint32_t tag, int (*procs)(int dev))
{
    struct board *b;

    if (dev < 0 || dev >= VGPU_MAX_DEVICES)
        return -1;
    pthread_once(&init_once, init);
    __atomic_store_n(&my_tag, tag, __ATOMIC_RELAXED);
    b = &boards[dev];
    if (VGPU_LIKELY(__atomic_load_n(&b->state, __ATOMIC_ACQUIRE)))
        return b->state > 0 ? 0 : -1;
    pthread_mutex_lock(&b->mu);
    b->procs = procs;
    if (!b->state)
        open_board(b, dev, key);
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
        now + BUSY_NS > __atomic_load_n(&b->mine.until, __ATOMIC_RELAXED))
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
    if (until > __atomic_load_n(&b->mine.until, __ATOMIC_RELAXED) + MARK_EVERY_NS)
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

/* ---- reading the others ---- */

/* its owner died (nobody holds its liveness lock): probed at most every LIVENESS_EVERY_NS */
static int entry_dead(struct board *b, int i, int64_t now)
{
    if (now - b->checked[i] > LIVENESS_EVERY_NS) {
        b->dead[i] = live_lock(b->fd, i, F_WRLCK, 1) == 0;
        b->checked[i] = now;
    }
    return b->dead[i];
}

/* an entry that checks and whose times make sense at `now`; its running sum (busy ns up to now) */
static int readable(const entry_t *e, int64_t now, int64_t *running)
{
    int64_t upto;

    if (e->sum != checksum(e) || !e->owner || e->owner == BOARD_MAGIC || e->born <= 0 || e->born > now ||
        e->since < e->born || e->since > now || e->until < e->since || e->until > now + HOLD_NS + MARK_EVERY_NS ||
        e->total < 0 || e->total > e->since - e->born)
        return 0;
    upto = e->until < now ? e->until : now; /* the rest of the stretch is a promise */
    *running = e->total + (upto - e->since);
    return 1;
}

/* rmu held: how much entry i's owner was busy since our last look (dt ago), by its running sum, or by
 * its last rate while it reads as junk; 0 for one we only begin to follow */
static int64_t grew(struct board *b, int i, const entry_t *e, int ok, int64_t running, int64_t now, int64_t dt)
{
    struct seen *s = &b->seen[i];
    int64_t d, span;
    unsigned g;

    if (!ok) {
        if (!s->owner || entry_dead(b, i, now)) {
            s->owner = 0;
            return 0;
        }
        /* alive, unreadable now: busy as far as its stretch reached, then as busy as it lately was */
        d = now <= s->until ? dt : dt * s->rate_ppm / 1000000;
        s->guessed += d;
        return d;
    }
    for (g = 0; g < GONE; g++)
        if (b->gone[g].owner == e->owner) { /* it moved here: followed on, its guess replaced by the truth */
            if (s->owner != e->owner)
                *s = b->gone[g];
            b->gone[g].owner = 0;
        }
    if (s->owner != e->owner) { /* new to us: only what it did since it took the entry, and since our last look */
        span = now - (e->born > b->looked ? e->born : b->looked);
        d = !b->looked ? 0 : running < span ? running : span;
        s->rate_ppm = now > e->born ? running * 1000000 / (now - e->born) : 0; /* its whole life's */
    } else {
        span = now - s->at;
        d = running - s->running - s->guessed; /* the guess made meanwhile is replaced by the truth */
        if (d > span - s->guessed)
            d = span - s->guessed;
    }
    if (d < 0)
        d = 0;
    if (!e->freed && entry_dead(b, i, now))
        d = 0; /* died: when, nobody can tell, and its last mark may reach far ahead */
    s->owner = e->owner;
    s->tag = e->tag;
    s->until = e->freed ? 0 : e->until;
    s->running = running;
    s->at = now;
    s->guessed = 0;
    if (span > 0)
        s->rate_ppm += (d * 1000000 / span - s->rate_ppm) / 4;
    return d;
}

/* rmu held: an owner we followed shows no more at its entry (someone else's is there: it was taken without
 * its lock, and the owner moves at its next launch, or it died): kept GONE_NS in case it turns up, busy as
 * far as its stretch reached and then at its last rate meanwhile, so the time it takes to move is not lost.
 * One that showed no use is not kept (a forger's idle entries would push real owners out). */
static void lose(struct board *b, struct seen *s)
{
    if (s->busy || s->rate_ppm > 0)
        b->gone[b->gone_head++ % GONE] = *s;
    s->owner = 0;
}

/* of another container, and of priority 0 */
static int high_tag(uint32_t tag)
{
    return tag != my_tag && (tag & VGPU_BOARD_HIGH);
}

/* rmu held: what the owners we lost were busy since the last look (dt ago); busy, foreign, high: counted in */
static int64_t guess_gone(struct board *b, int64_t now, int64_t dt, int *busy, int *foreign, int *high)
{
    int64_t d, sum = 0;
    unsigned g;

    for (g = 0; g < GONE; g++) {
        struct seen *s = &b->gone[g];
        if (!s->owner)
            continue;
        if (now - s->at > GONE_NS) {
            s->owner = 0; /* died, or reading only: gone for good */
            continue;
        }
        d = now <= s->until ? dt : dt * s->rate_ppm / 1000000;
        s->guessed += d;
        sum += d;
        *busy += now <= s->until;
        *foreign += now <= s->until && s->tag != my_tag;
        *high += now <= s->until && high_tag(s->tag);
    }
    return sum;
}

/* rmu held: look at the board now; add the others' growth to the history */
static void look_locked(struct board *b, int64_t now)
{
    ssize_t n = pread(b->fd, b->copy, sizeof b->copy, 0);
    int64_t dt = b->looked ? now - b->looked : 0, sum = 0, running[ENTRIES + 1];
    int i, mine = __atomic_load_n(&b->index, __ATOMIC_RELAXED), busy = 0, foreign = 0, high = 0;
    char ok[ENTRIES + 1];

    if (n < 0)
        n = 0;
    for (i = 1; i <= ENTRIES; i++) { /* first every owner that left its entry, then those that turn up */
        ok[i] = i != mine && (size_t)n >= sizeof(entry_t) * (size_t)(i + 1) && readable(&b->copy[i], now, &running[i]);
        if (ok[i] && b->seen[i].owner && b->seen[i].owner != b->copy[i].owner)
            lose(b, &b->seen[i]);
    }
    for (i = 1; i <= ENTRIES; i++) {
        const entry_t *e = &b->copy[i];
        if (i == mine)
            continue;
        sum += grew(b, i, e, ok[i], ok[i] ? running[i] : 0, now, dt);
        if (ok[i])
            b->seen[i].busy = !e->freed && e->until > now && !entry_dead(b, i, now);
        busy += b->seen[i].owner && b->seen[i].busy; /* junk now: as it was at the last readable look */
        foreign += b->seen[i].owner && b->seen[i].busy && (!ok[i] || e->tag != my_tag);
        high += b->seen[i].owner && b->seen[i].busy && high_tag(b->seen[i].tag);
    }
    sum += guess_gone(b, now, dt, &busy, &foreign, &high);
    if (sum > dt * MAX_OTHERS)
        sum = dt * MAX_OTHERS;
    b->busy_now = busy < MAX_OTHERS ? busy : MAX_OTHERS;
    b->foreign_now = foreign < MAX_OTHERS ? foreign : MAX_OTHERS;
    __atomic_store_n(&b->high_now, high < MAX_OTHERS ? high : MAX_OTHERS, __ATOMIC_RELAXED);
    b->running += sum;
    b->looked = now;
    if (b->count && now - b->hist[(b->head - 1) % HIST].t < SAMPLE_EVERY_NS) {
        b->hist[(b->head - 1) % HIST].t = now; /* too close: the last sample moves up */
        b->hist[(b->head - 1) % HIST].busy = b->running;
        return;
    }
    b->hist[b->head % HIST].t = now;
    b->hist[b->head % HIST].busy = b->running;
    b->head++;
    if (b->count < HIST)
        b->count++;
}

VGPU_HIDDEN void vgpu_board_sample(int dev)
{
    struct board *b;

    if (vgpu_board_state(dev) <= 0)
        return;
    b = &boards[dev];
    pthread_mutex_lock(&b->rmu);
    look_locked(b, fine_ns());
    pthread_mutex_unlock(&b->rmu);
}

VGPU_HIDDEN int vgpu_board_others(int dev)
{
    int n;

    if (vgpu_board_state(dev) <= 0)
        return 0;
    pthread_mutex_lock(&boards[dev].rmu);
    n = boards[dev].busy_now;
    pthread_mutex_unlock(&boards[dev].rmu);
    return n;
}

VGPU_HIDDEN int vgpu_board_foreign(int dev)
{
    int n;

    if (vgpu_board_state(dev) <= 0)
        return 0;
    pthread_mutex_lock(&boards[dev].rmu);
    n = boards[dev].foreign_now;
    pthread_mutex_unlock(&boards[dev].rmu);
    return n;
}

VGPU_HIDDEN int vgpu_board_high(int dev)
{
    return vgpu_board_state(dev) <= 0 ? 0 : __atomic_load_n(&boards[dev].high_now, __ATOMIC_RELAXED);
}

/* rmu held: the others' busy ns added up to time t, interpolated between looks; -1 before the first */
static int64_t busy_at(const struct board *b, int64_t t)
{
    unsigned lo = b->head - b->count, hi = b->head - 1, mid;
    int64_t t0, t1, v0, v1;

    if (!b->count || t < b->hist[lo % HIST].t)
        return -1;
    if (t >= b->hist[hi % HIST].t)
        return b->hist[hi % HIST].busy;
    while (hi - lo > 1) { /* hist[lo].t <= t < hist[hi].t */
        mid = lo + (hi - lo) / 2;
        if (b->hist[mid % HIST].t <= t)
            lo = mid;
        else
            hi = mid;
    }
    t0 = b->hist[lo % HIST].t, t1 = b->hist[hi % HIST].t;
    v0 = b->hist[lo % HIST].busy, v1 = b->hist[hi % HIST].busy;
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0);
}

VGPU_HIDDEN int64_t vgpu_board_busy(int dev, int64_t t0, int64_t t1)
{
    struct board *b;
    int64_t a, z;

    if (vgpu_board_state(dev) <= 0)
        return 0;
    if (t0 >= t1)
        return 0;
    b = &boards[dev];
    pthread_mutex_lock(&b->rmu);
    if (t1 > b->looked)
        t1 = b->looked; /* past our last look nothing is known yet */
    a = busy_at(b, t0);
    z = t0 < t1 ? busy_at(b, t1) : a;
    pthread_mutex_unlock(&b->rmu);
    if (a < 0 || z < 0)
        return -1;
    return z - a;
}
