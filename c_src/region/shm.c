/* Open, create, allocate, initialise and map the shared region; decide whether a file is safe to
 * trust; check a later process's limits against it; free our slot at exit; give a forked child
 * its own lock and slot.
 *
 * A region belongs to its container, all its uids (an su shell, a non-root worker): every one of
 * them draws from its one budget. The container is the directory the region lives in (HAMi gives
 * each container one of its own; the default /tmp is the container's own /tmp), so the directory
 * decides, not the uid (containers share uids: most run everything as root):
 * - we create the file readable and writable by exactly those who can reach the directory (its
 *   search bits: 0700 gives 0600, 0750 gives 0660, 0755 or 0777 gives 0666), set with fchmod (the
 *   process umask is never touched); in a sticky directory (a host's /tmp, /tmp/vgpulock: where
 *   users that share nothing else meet) it stays 0600. VGPU_SHARED_CACHE_MODE (octal) overrides.
 * - who may own it: our effective uid or root (HAMi's vendor library and monitor run as root),
 *   anywhere; any other uid only in a directory that is not sticky (vgpu_region_distrust), the
 *   directory being the one that really holds the file we opened. In a sticky directory a file of
 *   another uid may be anybody's, and is refused with one line (limits then per process).
 * A file of an accepted owner may be group/other-writable, which is why a region can only tighten
 * this process's env limits, never lift them (limits/: vgpu_limit_in_force). A symlink at the path
 * is refused (O_NOFOLLOW), so is anything not a regular file, a file with a second name, a short
 * file, a foreign magic or major version, and a process table that is garbage
 * (vgpu_region_table_insane).
 *
 * The whole file is allocated (posix_fallocate) before it is mapped: a sparse file on a
 * full filesystem would kill the process with SIGBUS on its first write; when the space is not
 * there we say so once and keep per-process limits.
 *
 * Attach takes the region lock only to create the file and to claim a slot (microseconds): a
 * storm of processes starting together does not queue behind /proc reads or a 2 MB memset. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static vgpu_region_t *region;
static vgpu_proc_slot_t *self_slot;
static int region_fd = -1; /* the lock's and our liveness byte's descriptor (never mapped) */
static int attach_tried;
static int owner_pid;   /* the pid self_slot belongs to */
static int forked;      /* set in a fork child: the slot is the parent's, the descriptor closed */
static int left;        /* our destructor ran: the process is exiting, its slot an exit hold */
static char region_path[4096];

/* the mode a file we create in a directory of mode `dir` gets (0: unknown) */
static mode_t file_mode(mode_t dir)
{
    const char *s = getenv("VGPU_SHARED_CACHE_MODE");
    mode_t mode = 0600;
    char *end;
    unsigned long m;

    if (dir && !(dir & S_ISVTX)) /* those who can reach the directory: the container's uids */
        mode |= (dir & S_IXGRP ? 0060 : 0) | (dir & S_IXOTH ? 0006 : 0);
    if (!s || !*s)
        return mode;
    m = strtoul(s, &end, 8);
    if (*end || m > 0777 || (m & 0600) != 0600) {
        VGPU_WARN("ignoring VGPU_SHARED_CACHE_MODE='%.16s': want an octal mode like 0660 that keeps owner rw", s);
        return mode;
    }
    return (mode_t)m;
}

/* The directory that holds `path` as `fd` was opened from it: its stat in *dir, 0; -1 when it cannot
 * be told (then the strict rule holds: only our uid or root may own the region). The name is looked
 * up again in the opened directory and must be the file we hold, so the directory judged is the
 * one that holds it, whatever was renamed meanwhile. */
static int holding_dir(const char *path, int fd, struct stat *dir)
{
    char buf[4096], *slash;
    const char *dname, *base;
    struct stat a, b;
    int dfd, ok;

    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    slash = strrchr(buf, '/');
    if (!slash) {
        dname = ".";
        base = buf;
    } else {
        *slash = 0;
        dname = slash == buf ? "/" : buf;
        base = slash + 1;
    }
    if (!*base || (dfd = open(dname, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -1;
    ok = fstat(dfd, dir) == 0 && fstatat(dfd, base, &a, AT_SYMLINK_NOFOLLOW) == 0 && (fd < 0 || fstat(fd, &b) == 0) &&
         (fd < 0 || (a.st_dev == b.st_dev && a.st_ino == b.st_ino));
    close(dfd);
    return ok ? 0 : -1;
}

static void atfork_child(void)
{
    forked = 1;
    left = 0;
    vgpu_region_lock_atfork_child(); /* closes our copy of the parent's descriptor, now */
    region_fd = -1;
    vgpu_region_shadow_reset(); /* the parent's allocations are not the child's */
    vgpu_ident_reset();
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    attach_mu = fresh;
}

static void copy_devices(vgpu_region_t *r, const vgpu_region_config_t *cfg)
{
    int d, n = cfg->device_count < 0 ? 0 : cfg->device_count;

    if (n > VGPU_MAX_DEVICES)
        n = VGPU_MAX_DEVICES;
    for (d = 0; d < n; d++) {
        memcpy(r->uuids[d], cfg->uuid[d], VGPU_UUID_LEN - 1);
        r->uuids[d][VGPU_UUID_LEN - 1] = 0;
    }
    __atomic_store_n(&r->device_num, (uint64_t)n, __ATOMIC_RELEASE);
}

/* a file that already held bytes without the magic (a creator died mid-initialisation): zero what
 * is not zero. Reading a fresh file's pages is cheap; writing 2 MB of zeros would dirty them all. */
static void zero_scan(vgpu_region_t *r)
{
    uint64_t *w = (uint64_t *)(void *)r;
    size_t i, n = sizeof *r / sizeof *w;

    for (i = 0; i < n; i++)
        if (w[i])
            w[i] = 0;
}

static void init_region(vgpu_region_t *r, const vgpu_region_config_t *cfg, int zeroed, int fd, const char *path)
{
    int d;

    if (!zeroed)
        zero_scan(r);
    r->major_version = VGPU_REGION_MAJOR;
    r->minor_version = VGPU_REGION_MINOR;
    r->owner_pid = (uint64_t)getpid();
    sem_init(&r->sem, 1, 1); /* for vendor peers, which lock with it */
    sem_init(&r->sem_postinit, 1, 1);
    copy_devices(r, cfg);
    /* every entry, not only the devices known now: limits come from the env, which names no count */
    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        r->limit[d] = cfg->limit[d];
        r->sm_limit[d] = cfg->sm_limit[d];
    }
    r->utilization_switch = 1; /* throttle by default; the monitor may lift it */
    r->priority = cfg->priority;
    r->last_kernel_time = (uint64_t)time(0); /* as the vendor does, at creation */
    vgpu_region_inherit(r, fd, path); /* a deleted predecessor's live processes (heir.c) */
    /* the magic goes last: a peer or the monitor that sees it sees everything above */
    __atomic_store_n(&r->initialized_flag, VGPU_REGION_MAGIC, __ATOMIC_RELEASE);
}

VGPU_HIDDEN void vgpu_region_fill_devices(const vgpu_region_config_t *cfg)
{
    vgpu_region_t *r = vgpu_region_get();

    if (!r || cfg->device_count <= 0 || __atomic_load_n(&r->device_num, __ATOMIC_ACQUIRE))
        return;
    if (!vgpu_region_self() || !(r = vgpu_region_get())) /* also gives a fork child its own lock */
        return;
    vgpu_region_lock();
    if (!r->device_num)
        copy_devices(r, cfg);
    vgpu_region_unlock();
}

/* env and region disagree: say which one limits/ enforces */
static const char *winner(uint64_t region_v, uint64_t env_v)
{
    return vgpu_limit_in_force(region_v, env_v) == env_v
               ? "this process's (stricter; a region can tighten a limit, never lift it)"
               : "the region's (it is shared by the whole container)";
}

/* a later process's env that disagrees with the region: say so once per value */
static void check_config(const vgpu_region_t *r, const vgpu_region_config_t *cfg)
{
    if (r->priority != cfg->priority)
        VGPU_WARN("CUDA_TASK_PRIORITY: this process's env gives %d, region %s holds %d; using the region's",
                  cfg->priority, region_path, r->priority);
    int d, n = cfg->device_count > (int)r->device_num ? cfg->device_count : (int)r->device_num;

    if (n < 1) /* devices not known yet: the env applies to device 0 like to any other */
        n = 1;
    if (n > VGPU_MAX_DEVICES)
        n = VGPU_MAX_DEVICES;
    for (d = 0; d < n; d++) {
        if (r->limit[d] != cfg->limit[d])
            VGPU_WARN("device %d memory limit: this process's env gives %llu bytes, region %s (created by pid "
                      "%llu) holds %llu bytes; using %s", d, (unsigned long long)cfg->limit[d], region_path,
                      (unsigned long long)r->owner_pid, (unsigned long long)r->limit[d],
                      winner(r->limit[d], cfg->limit[d]));
        if (vgpu_sm_norm(r->sm_limit[d]) != vgpu_sm_norm(cfg->sm_limit[d]))
            VGPU_WARN("device %d SM limit: this process's env gives %llu%%, region %s holds %llu%%; using %s", d,
                      (unsigned long long)cfg->sm_limit[d], region_path, (unsigned long long)r->sm_limit[d],
                      winner(vgpu_sm_norm(r->sm_limit[d]), vgpu_sm_norm(cfg->sm_limit[d])));
        if (d < cfg->device_count && cfg->uuid[d][0] && r->uuids[d][0] &&
            strncmp(r->uuids[d], cfg->uuid[d], VGPU_UUID_LEN))
            VGPU_WARN("device %d is %.95s here but %.95s in region %s; processes of this container see "
                      "different devices (CUDA_VISIBLE_DEVICES?)", d, cfg->uuid[d], r->uuids[d], region_path);
    }
}

#define PER_PROCESS "memory limits are per process only"

static int open_file(const char *path, int *created)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat dir;

    *created = fd >= 0;
    if (fd >= 0) {
        if (fchmod(fd, file_mode(holding_dir(path, fd, &dir) == 0 ? dir.st_mode : 0)) != 0)
            VGPU_WARN("cannot set the mode of region %s: %s", path, strerror(errno));
        return fd;
    }
    if (errno == EEXIST)
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if (e == EACCES && lstat(path, &st) == 0)
            VGPU_WARN("cannot open region %s (mode %03o, owner uid %d, we are uid %d); " PER_PROCESS
                      "; a region in a directory of the container's own (not a sticky one such as /tmp) is "
                      "shared by all its uids, or set VGPU_SHARED_CACHE_MODE=0666 in the container",
                      path, (unsigned)(st.st_mode & 0777), (int)st.st_uid, (int)geteuid());
        else
            VGPU_WARN("cannot open region %s: %s%s; " PER_PROCESS, path, strerror(e),
                      e == ELOOP ? " (a symlink: refused)" : "");
    }
    return fd;
}

/* the file is ours to trust (vgpu_region_distrust), or a warning says why not */
static int trusted(int fd, const char *path, struct stat *st)
{
    struct stat dir;
    int have_dir = holding_dir(path, fd, &dir) == 0;

    switch (fstat(fd, st) != 0 ? VGPU_DISTRUST_TYPE : vgpu_region_distrust(st, have_dir ? &dir : 0)) {
    case 0:
        return 1;
    case VGPU_DISTRUST_TYPE:
        VGPU_WARN("region %s is not a regular file; " PER_PROCESS, path);
        return 0;
    case VGPU_DISTRUST_OWNER:
        VGPU_WARN("region %s is owned by uid %d, not by us (uid %d) or root, in %s; refusing it (its limits "
                  "could be forged); " PER_PROCESS, path, (int)st->st_uid, (int)geteuid(),
                  have_dir ? "a sticky directory, where anyone may have put it" : "a directory we cannot check");
        return 0;
    case VGPU_DISTRUST_LINKS:
        VGPU_WARN("region %s has %lu names (a hard link to another file?); refusing it; " PER_PROCESS, path,
                  (unsigned long)st->st_nlink);
        return 0;
    default:
        VGPU_WARN("region %s is read-only (mode %03o); refusing it; " PER_PROCESS, path,
                  (unsigned)(st->st_mode & 0777));
        return 0;
    }
}

/* every byte of the file backed by storage, so no later store into the mapping can SIGBUS */
static int allocate(int fd, const char *path, int fresh)
{
    int rc;

    /* a fresh file: posix_fallocate (glibc writes zeros itself where the filesystem cannot).
     * A file peers already map: only the syscall, never glibc's write-back emulation. */
    if (fresh)
        rc = posix_fallocate(fd, 0, (off_t)sizeof(vgpu_region_t));
    else
        rc = fallocate(fd, 0, 0, (off_t)sizeof(vgpu_region_t)) == 0 ? 0 : errno;
    if (rc == 0 || (!fresh && (rc == EOPNOTSUPP || rc == ENOSYS)))
        return 0;
    VGPU_WARN("cannot allocate %zu bytes for region %s: %s; " PER_PROCESS, sizeof(vgpu_region_t), path,
              strerror(rc));
    if (fresh && ftruncate(fd, 0) != 0) /* leave an empty file, never a short one */
        VGPU_DEBUG("truncating %s: %s", path, strerror(errno));
    return -1;
}

static vgpu_region_t *map_file(int fd, const char *path)
{
    void *p = mmap(0, sizeof(vgpu_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    if (p == MAP_FAILED) {
        VGPU_WARN("cannot map region %s: %s; " PER_PROCESS, path, strerror(errno));
        return 0;
    }
    return p;
}

static int has_magic(const vgpu_region_t *r)
{
    return __atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) == VGPU_REGION_MAGIC;
}

/* Lock held. Size, allocate and initialise a file nobody has initialised yet. */
static vgpu_region_t *create_locked(int fd, const char *path, const vgpu_region_config_t *cfg)
{
    struct stat st;
    vgpu_region_t *r;
    int fresh;

    if (fstat(fd, &st) != 0)
        return 0;
    fresh = st.st_size == 0;
    /* never truncate or reinitialise a file someone else filled: it may not be ours at all */
    if (!fresh && st.st_size < (off_t)sizeof(vgpu_region_t)) {
        VGPU_WARN("region %s has %lld bytes, layout 1.2 needs %zu; remove it when no process uses it", path,
                  (long long)st.st_size, sizeof(vgpu_region_t));
        return 0;
    }
    if (allocate(fd, path, fresh) != 0 || !(r = map_file(fd, path)))
        return 0;
    if (!has_magic(r)) /* an exact-size file without the magic: its creator died mid-initialisation */
        init_region(r, cfg, fresh, fd, path);
    return r;
}

static vgpu_region_t *open_region(int fd, const char *path, const vgpu_region_config_t *cfg)
{
    struct stat st;
    vgpu_region_t *r = 0;
    const char *why;

    if (!trusted(fd, path, &st))
        return 0;
    vgpu_region_set_file_id((uint64_t)st.st_dev, (uint64_t)st.st_ino, path);
    if (st.st_size >= (off_t)sizeof(vgpu_region_t)) {
        /* the common case, no lock: an initialised file (a writer may have rounded its size up);
         * still make sure the part we map is backed */
        if (allocate(fd, path, 0) != 0 || !(r = map_file(fd, path)))
            return 0;
    }
    if (!r || !has_magic(r)) {
        if (r) {
            munmap(r, sizeof *r);
            r = 0;
        }
        vgpu_region_lock(); /* the creator holds it while it initialises */
        r = create_locked(fd, path, cfg);
        vgpu_region_unlock();
        if (!r)
            return 0;
    }
    if (r->major_version != VGPU_REGION_MAJOR) {
        VGPU_WARN("region %s has layout %u.%u, this shim writes %u.x; " PER_PROCESS, path, r->major_version,
                  r->minor_version, VGPU_REGION_MAJOR);
        goto refuse;
    }
    if ((why = vgpu_region_table_insane(r))) {
        VGPU_WARN("region %s is corrupt (%s); refusing it; " PER_PROCESS, path, why);
        goto refuse;
    }
    return r;
refuse:
    munmap(r, sizeof *r);
    return 0;
}

/* The lock and our liveness byte live on a descriptor of their own that is never mapped: a
 * mapping keeps its open file description alive in every fork child that inherits it, and an
 * OFD lock lives as long as its description, so a lock on the mapped one would outlive us. */
static int open_lock_fd(int map_fd, const char *path)
{
    struct stat a, b;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);

    if (fd >= 0 && (fstat(fd, &a) != 0 || fstat(map_fd, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)) {
        close(fd); /* replaced between our two opens */
        fd = -1;
    }
    return fd;
}

static int do_attach(const char *path, const vgpu_region_config_t *cfg)
{
    vgpu_region_t *r;
    int created, fd, lfd;

    fd = open_file(path, &created);
    if (fd < 0)
        return -1;
    lfd = open_lock_fd(fd, path);
    if (lfd < 0) {
        VGPU_WARN("cannot reopen region %s: %s; " PER_PROCESS, path, strerror(errno));
        close(fd);
        return -1;
    }
    vgpu_region_lock_set_fd(lfd);
    r = open_region(fd, path, cfg);
    close(fd); /* the mapping keeps what it needs */
    if (!r)
        goto fail_fd;
    if (!created)
        check_config(r, cfg);
    vgpu_live_hold(lfd, vgpu_ident_self()->nonce); /* before the stamp: peers judge us by it */
    vgpu_region_lock();
    vgpu_region_reap(r, 0); /* dead peers' usage out of the monitor's sum; their slots reused first */
    self_slot = vgpu_region_claim_slot(r);
    vgpu_region_unlock();
    if (!self_slot) {
        VGPU_WARN("region %s: all %d process slots hold live processes; " PER_PROCESS, path, VGPU_LEDGER_SLOT);
        munmap(r, sizeof *r);
        goto fail_fd;
    }
    region_fd = lfd;
    owner_pid = (int)getpid();
    __atomic_store_n(&region, r, __ATOMIC_RELEASE);
    return 0;
fail_fd:
    vgpu_region_lock_set_fd(-1);
    close(lfd);
    return -1;
}

VGPU_HIDDEN int vgpu_region_attach(const char *path, const vgpu_region_config_t *cfg)
{
    static int atfork_done;
    int rc;

    if (__atomic_load_n(&region, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&attach_mu);
    if (region) {
        rc = 0;
    } else if (attach_tried) {
        rc = -1; /* warned once already; do not retry (and re-warn) on every allocation */
    } else {
        attach_tried = 1;
        if (path && *path)
            snprintf(region_path, sizeof region_path, "%s", path);
        else
            vgpu_region_choose_path(region_path, sizeof region_path);
        if (!atfork_done) {
            atfork_done = 1;
            pthread_atfork(0, 0, atfork_child);
        }
        rc = do_attach(region_path, cfg);
    }
    pthread_mutex_unlock(&attach_mu);
    return rc;
}

VGPU_HIDDEN vgpu_region_t *vgpu_region_get(void)
{
    return __atomic_load_n(&region, __ATOMIC_ACQUIRE);
}

/* first use in a fork child: own descriptor (lock and liveness byte) and own slot, or none */
static void adopt_after_fork(void)
{
    int fd;

    pthread_mutex_lock(&attach_mu);
    if (!forked) {
        pthread_mutex_unlock(&attach_mu);
        return;
    }
    self_slot = 0;
    if (region) {
        fd = open(region_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        region_fd = fd;
        vgpu_region_lock_set_fd(fd);
        if (fd >= 0) {
            vgpu_live_hold(fd, vgpu_ident_self()->nonce);
            vgpu_region_lock();
            self_slot = vgpu_region_claim_slot(region);
            vgpu_region_unlock();
        }
        if (!self_slot)
            __atomic_store_n(&region, 0, __ATOMIC_RELEASE);
    }
    owner_pid = (int)getpid();
    __atomic_store_n(&forked, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&attach_mu);
}

/* our slot moved or was taken over (a vendor peer compacted the table): find it again */
static vgpu_proc_slot_t *relocate(vgpu_proc_slot_t *lost)
{
    vgpu_proc_slot_t *s;

    pthread_mutex_lock(&attach_mu);
    s = self_slot;
    if (region && s == lost && !vgpu_region_slot_is_self(region, s)) {
        vgpu_region_lock();
        s = vgpu_region_relocate(region, lost);
        vgpu_region_unlock();
        __atomic_store_n(&self_slot, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_mu);
    return s;
}

VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_self(void)
{
    vgpu_proc_slot_t *s;
    vgpu_region_t *r;

    if (VGPU_UNLIKELY(__atomic_load_n(&forked, __ATOMIC_ACQUIRE)))
        adopt_after_fork();
    s = __atomic_load_n(&self_slot, __ATOMIC_ACQUIRE);
    r = __atomic_load_n(&region, __ATOMIC_ACQUIRE);
    if (VGPU_UNLIKELY(s && r && !vgpu_region_slot_is_self(r, s)))
        s = relocate(s);
    return s;
}

VGPU_HIDDEN void vgpu_region_detach(void)
{
    vgpu_proc_slot_t *s = forked ? 0 : vgpu_region_self(); /* found again if a peer moved it */

    pthread_mutex_lock(&attach_mu);
    __atomic_store_n(&left, region != 0, __ATOMIC_RELEASE);
    /* a child that never used the region owns no slot */
    self_slot = 0;
    if (s && region && owner_pid == (int)getpid() && vgpu_region_slot_is_self(region, s)) {
        vgpu_region_lock();
        vgpu_region_leave(s); /* what we still hold is freed only once we are gone: it stays counted */
        vgpu_region_unlock();
    }
    /* the mapping stays: other threads may still read it while the process exits */
    pthread_mutex_unlock(&attach_mu);
}

VGPU_HIDDEN int vgpu_region_left(void)
{
    return __atomic_load_n(&left, __ATOMIC_ACQUIRE);
}

__attribute__((destructor)) static void region_at_exit(void)
{
    vgpu_region_detach();
}
