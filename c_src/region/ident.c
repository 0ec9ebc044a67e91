/* Process identity that survives pid namespaces, the stamp that carries it in a slot, and the
 * liveness lock that proves it.
 *
 * A slot's pid means something only in its owner's pid namespace, and a container restart is a
 * new namespace whose pids repeat the old ones. So every process of ours:
 * - stamps its slot with (start time, pid-namespace inode, a random nonce) and a check word that
 *   binds them to the slot's pid (layout.h says where: words the monitor and vendor ignore);
 * - holds an open-file-description write lock (F_OFD_SETLK) on one byte of the region file,
 *   LIVE_BASE + (nonce mod 2^40), far past its end, for as long as it lives. The kernel drops it
 *   when the process dies, whatever namespace looks at it, so F_OFD_GETLK on that byte tells any
 *   peer whether the stamper is alive. A forked child closes its copy of the descriptor at once
 *   (atfork), so it never keeps its parent looking alive; exec closes it (O_CLOEXEC).
 * Vendor writers never write the stamp words, so a stamp left by a dead process of ours can
 * survive under a slot a vendor process reused: the check word covers the pid, and a stamp whose
 * stamper is gone is trusted to mean "dead" only when no process with that pid in our namespace
 * has the region mapped (slots.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "region/region.h"

#ifndef F_OFD_GETLK /* Linux 3.15; glibc headers older than 2.20 lack the names */
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

#define LIVE_BASE (1ll << 41)
#define LIVE_MASK ((1ull << 40) - 1)
#define STAMP_MAGIC 0x7667707573743031ull /* "vgpust01" */

static vgpu_ident_t self_ident;
static int ident_pid;  /* the pid self_ident was computed for (0: not yet) */
static int ident_held; /* we hold our liveness byte: only then is our stamp worth a check word */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

VGPU_HIDDEN uint64_t vgpu_pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint64_t fresh_nonce(int pid, uint64_t start)
{
    struct timespec ts;
    uint64_t n, seed = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

    if (fd >= 0) {
        if (read(fd, &seed, sizeof seed) != (ssize_t)sizeof seed)
            seed = 0;
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    n = mix(seed ^ mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30)) ^ mix((uint64_t)pid << 32 ^ start) ^
            (uint64_t)(uintptr_t)&n);
    return n ? n : 1;
}

/* computed once per process image; a fork child gets its own (vgpu_ident_reset from atfork):
 * no getpid() syscall on every allocation */
VGPU_HIDDEN const vgpu_ident_t *vgpu_ident_self(void)
{
    if (VGPU_UNLIKELY(!__atomic_load_n(&ident_pid, __ATOMIC_ACQUIRE))) {
        int pid = (int)getpid();
        self_ident.pid = pid;
        self_ident.start = vgpu_proc_starttime(0);
        self_ident.ns = vgpu_pid_ns();
        self_ident.nonce = fresh_nonce(pid, self_ident.start);
        ident_held = 0;
        __atomic_store_n(&ident_pid, pid, __ATOMIC_RELEASE);
    }
    return &self_ident;
}

VGPU_HIDDEN void vgpu_ident_reset(void)
{
    ident_pid = 0;
    ident_held = 0;
}

static uint64_t check_word(int pid, uint64_t start, uint64_t ns, uint64_t nonce)
{
    return mix(STAMP_MAGIC ^ mix((uint64_t)(uint32_t)pid ^ mix(start ^ mix(ns ^ mix(nonce)))));
}

VGPU_HIDDEN void vgpu_stamp_write(vgpu_proc_slot_t *s, const vgpu_ident_t *id)
{
    /* unused[0] and unused[1] keep the meaning builds before the check word gave them */
    __atomic_store_n(&s->unused[0], id->start, __ATOMIC_RELAXED);
    __atomic_store_n(&s->unused[1], id->ns, __ATOMIC_RELAXED);
    __atomic_store_n(&s->used[0].unused[1], id->nonce, __ATOMIC_RELAXED);
    /* without a liveness byte peers could only think us dead: no check word, so they judge our pid */
    __atomic_store_n(&s->used[0].unused[0], ident_held ? check_word(id->pid, id->start, id->ns, id->nonce) : 0,
                     __ATOMIC_RELEASE);
}

VGPU_HIDDEN void vgpu_stamp_clear(vgpu_proc_slot_t *s)
{
    __atomic_store_n(&s->used[0].unused[0], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&s->used[0].unused[1], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->unused[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->unused[1], 0, __ATOMIC_RELAXED);
}

VGPU_HIDDEN int vgpu_stamp_read(const vgpu_proc_slot_t *s, vgpu_ident_t *out)
{
    uint64_t check = __atomic_load_n(&s->used[0].unused[0], __ATOMIC_ACQUIRE);

    out->pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
    out->start = __atomic_load_n(&s->unused[0], __ATOMIC_RELAXED);
    out->ns = __atomic_load_n(&s->unused[1], __ATOMIC_RELAXED);
    out->nonce = __atomic_load_n(&s->used[0].unused[1], __ATOMIC_RELAXED);
    return check && out->nonce && out->pid > 0 && check == check_word(out->pid, out->start, out->ns, out->nonce);
}

static int ofd_ok = 1; /* cleared when the kernel has no OFD locks (< 3.15): liveness then unknown */

static void live_range(struct flock *fl, short type, uint64_t nonce)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)(LIVE_BASE + (long long)(nonce & LIVE_MASK));
    fl->l_len = 1;
}

VGPU_HIDDEN int vgpu_live_hold(int fd, uint64_t nonce)
{
    struct flock fl;

    if (fd < 0 || !ofd_ok)
        return -1;
    live_range(&fl, F_WRLCK, nonce);
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
        ident_held = nonce == self_ident.nonce;
        return 0;
    }
    if (errno == EINVAL)
        ofd_ok = 0;
    return -1;
}

VGPU_HIDDEN int vgpu_live_probe(int fd, uint64_t nonce)
{
    struct flock fl;

    if (fd < 0 || !ofd_ok)
        return -1;
    live_range(&fl, F_WRLCK, nonce);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) {
        if (errno == EINVAL)
            ofd_ok = 0;
        return -1;
    }
    return fl.l_type == F_WRLCK; /* a read lock is a reader's, never the owner's: not a sign of life */
}

/* glibc's dev_t encoding, by hand: the major()/minor() helpers are library symbols in old glibc */
static unsigned dev_major(uint64_t dev)
{
    return (unsigned)(((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfffull));
}

static unsigned dev_minor(uint64_t dev)
{
    return (unsigned)((dev & 0xff) | ((dev >> 12) & ~0xffull));
}

/* 1 when /proc/<pid>/maps shows the file (dev, ino) or `path` (or a deleted file of that name)
 * mapped; 0 when it shows neither; -1 when it cannot be read (no /proc, another user's process):
 * the caller must assume a user */
VGPU_HIDDEN int vgpu_proc_maps_file(int pid, uint64_t dev, uint64_t ino, const char *path)
{
    char name[64], buf[8192], *line, *nl;
    size_t have = 0;
    ssize_t n;
    int fd, found = 0, got_any = 0;

    snprintf(name, sizeof name, "/proc/%d/maps", pid);
    fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    while (!found && (n = read(fd, buf + have, sizeof buf - 1 - have)) > 0) {
        have += (size_t)n;
        buf[have] = 0;
        got_any = 1;
        for (line = buf; !found && (nl = strchr(line, '\n')); line = nl + 1) {
            unsigned maj = 0, min = 0;
            unsigned long long off = 0, lino = 0;
            char perms[8];
            int pos = 0;

            *nl = 0;
            if (sscanf(line, "%*s %7s %llx %x:%x %llu %n", perms, &off, &maj, &min, &lino, &pos) >= 5) {
                const char *p = pos > 0 ? line + pos : "";
                size_t k = path ? strlen(path) : 0;
                /* "<path> (deleted)": a file the region replaced (heir.c), still holding its usage */
                if ((lino == ino && lino && maj == dev_major(dev) && min == dev_minor(dev)) ||
                    (k && *p && strncmp(p, path, k) == 0 && (!p[k] || strcmp(p + k, " (deleted)") == 0)))
                    found = 1;
            }
        }
        have = strlen(line); /* keep the partial last line */
        memmove(buf, line, have);
        if (have >= sizeof buf - 1)
            have = 0; /* a path longer than the buffer: skip it */
    }
    close(fd);
    return found ? 1 : got_any ? 0 : -1;
}

/* ---- /proc: what a pid in our namespace is ---- */

/* /proc/<pid>/stat (pid 0: /proc/self/stat, right even where /proc is another namespace's):
 * state (field 3), flags (field 9) and starttime (field 22). -1 when unreadable. */
static int read_stat_flags(int pid, char *state, unsigned long *flags, uint64_t *start)
{
    char path[64], buf[1024], *p;
    unsigned long long st = 0;
    unsigned long fl = 0;
    ssize_t n;
    int fd, field;

    if (pid)
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* comm may contain spaces and ')' */
    if (!p || p[1] != ' ')
        return -1;
    *state = p[2];
    p += 2;
    for (field = 3; field < 22 && *p; p++) {
        if (*p != ' ')
            continue;
        field++;
        if (field == 9 && sscanf(p + 1, "%lu", &fl) != 1)
            return -1;
    }
    if (field != 22 || sscanf(p, "%llu", &st) != 1)
        return -1;
    *flags = fl;
    *start = st;
    return 0;
}

VGPU_HIDDEN int vgpu_proc_stat(int pid, char *state, uint64_t *start)
{
    unsigned long flags;
    return read_stat_flags(pid, state, &flags, start);
}

/* "Threads:" of /proc/<pid>/status, 0 when unreadable */
static int thread_count(int pid)
{
    char path[64], buf[2048], *p;
    ssize_t n;
    int fd, threads = 0;

    snprintf(path, sizeof path, "/proc/%d/status", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    p = strstr(buf, "\nThreads:");
    return p && sscanf(p + 9, "%d", &threads) == 1 ? threads : 0;
}

#define PF_EXITING_FLAG 0x4ul /* the kernel's PF_EXITING: set when a task starts to exit */

/* Is the process (pid, start time) in our namespace still exiting? A dying process drops its
 * liveness byte when its descriptors are released, and the kernel releases them in an order of its
 * own: the driver's (which hold its device memory) can go after ours, and freeing a large context
 * takes a while. Until the process is gone, a zombie whose other threads are gone too, its memory
 * may still be held, so its slot stays counted. 0 when it is gone, or alive and not exiting (an
 * exec dropped the byte: the old image's memory went with it). */
VGPU_HIDDEN int vgpu_proc_still_exiting(int pid, uint64_t want_start)
{
    unsigned long flags;
    uint64_t start;
    char state;

    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return 0;
    if (read_stat_flags(pid, &state, &flags, &start) != 0 || start != want_start || state == 'X')
        return 0; /* gone meanwhile, or the pid is another process's now */
    if (state == 'Z')
        return thread_count(pid) > 1; /* the leader is done; its last thread may not be */
    return (flags & PF_EXITING_FLAG) != 0;
}

VGPU_HIDDEN uint64_t vgpu_proc_starttime(int pid)
{
    char state;
    uint64_t start;
    return vgpu_proc_stat(pid, &state, &start) == 0 ? start : 0;
}
