/* Open, create, initialise and map the shared region; check a later process's limits against it;
 * free our slot at exit; give a forked child its own lock and slot.
 *
 * File mode: 0600 unless VGPU_SHARED_CACHE_MODE (octal, e.g. 0660) says otherwise. The file lets
 * any writer forge usage and limits, so it is never world-writable by default (the vendor's 0666
 * is a known defect). It lives in a per-container directory; the processes of one container
 * normally run as one user, and HAMi's monitor reads it as root on the host. A container mixing
 * users sets the variable; a process that cannot open the file warns and keeps process-local
 * limits. The mode is set with fchmod on the file we created: the process umask is never touched. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log/log.h"
#include "region/region.h"

static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static vgpu_region_t *region;
static vgpu_proc_slot_t *self_slot;
static int region_fd = -1;
static int attach_tried;
static int owner_pid;   /* the pid self_slot belongs to */
static int forked;      /* set in a fork child: the slot and lock fd are the parent's */
static char region_path[4096];

static mode_t file_mode(void)
{
    const char *s = getenv("VGPU_SHARED_CACHE_MODE");
    char *end;
    unsigned long m;

    if (!s || !*s)
        return 0600;
    m = strtoul(s, &end, 8);
    if (*end || m > 0777 || !(m & 0600)) {
        VGPU_WARN("ignoring VGPU_SHARED_CACHE_MODE='%.16s': want an octal mode like 0660 that keeps owner rw", s);
        return 0600;
    }
    return (mode_t)m;
}

static void atfork_child(void)
{
    forked = 1;
    vgpu_region_lock_atfork_child();
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

static void init_region(vgpu_region_t *r, const vgpu_region_config_t *cfg)
{
    int d;

    memset(r, 0, sizeof *r);
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

/* a later process's env that disagrees with the region: say so once per value; the region wins */
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
                      "%llu) holds %llu bytes; using the region's (it is shared by the whole container)",
                      d, (unsigned long long)cfg->limit[d], region_path, (unsigned long long)r->owner_pid,
                      (unsigned long long)r->limit[d]);
        if (r->sm_limit[d] != cfg->sm_limit[d])
            VGPU_WARN("device %d SM limit: this process's env gives %llu%%, region %s holds %llu%%; using the "
                      "region's", d, (unsigned long long)cfg->sm_limit[d], region_path,
                      (unsigned long long)r->sm_limit[d]);
        if (d < cfg->device_count && cfg->uuid[d][0] && r->uuids[d][0] && strncmp(r->uuids[d], cfg->uuid[d], VGPU_UUID_LEN))
            VGPU_WARN("device %d is %.95s here but %.95s in region %s; processes of this container see "
                      "different devices (CUDA_VISIBLE_DEVICES?)", d, cfg->uuid[d], r->uuids[d], region_path);
    }
}

static int open_file(const char *path, int *created)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

    *created = fd >= 0;
    if (fd >= 0) {
        if (fchmod(fd, file_mode()) != 0)
            VGPU_WARN("cannot set the mode of region %s: %s", path, strerror(errno));
        return fd;
    }
    if (errno == EEXIST)
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if (e == EACCES && stat(path, &st) == 0)
            VGPU_WARN("cannot open region %s (mode %03o, owner uid %d, we are uid %d); memory limits are per "
                      "process only; set VGPU_SHARED_CACHE_MODE=0660 in the container to share it",
                      path, (unsigned)(st.st_mode & 0777), (int)st.st_uid, (int)getuid());
        else
            VGPU_WARN("cannot open region %s: %s%s; memory limits are per process only", path, strerror(e),
                      e == ELOOP ? " (a symlink: refused)" : "");
    }
    return fd;
}

/* map the file, sizing it when empty; NULL (with a warning) when it is not usable */
static vgpu_region_t *map_file(int fd, const char *path, int *fresh)
{
    struct stat st;
    void *p;

    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        VGPU_WARN("region %s is not a regular file; memory limits are per process only", path);
        return 0;
    }
    if (st.st_size == 0 && ftruncate(fd, (off_t)sizeof(vgpu_region_t)) != 0) {
        VGPU_WARN("cannot size region %s: %s; memory limits are per process only", path, strerror(errno));
        return 0;
    }
    /* never truncate or reinitialise a file someone else filled: it may not be ours at all */
    if (st.st_size != 0 && st.st_size < (off_t)sizeof(vgpu_region_t)) {
        VGPU_WARN("region %s has %lld bytes, layout 1.2 needs %zu; remove it when no process uses it",
                  path, (long long)st.st_size, sizeof(vgpu_region_t));
        return 0;
    }
    p = mmap(0, sizeof(vgpu_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        VGPU_WARN("cannot map region %s: %s", path, strerror(errno));
        return 0;
    }
    /* an exact-size file without the magic is a creator that died mid-initialisation */
    *fresh = st.st_size == 0 || st.st_size == (off_t)sizeof(vgpu_region_t);
    return p;
}

static int do_attach(const char *path, const vgpu_region_config_t *cfg)
{
    vgpu_region_t *r;
    int created, fresh = 0, fd;

    fd = open_file(path, &created);
    if (fd < 0)
        return -1;
    vgpu_region_lock_set_fd(fd);
    vgpu_region_lock();
    r = map_file(fd, path, &fresh);
    if (r && __atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_REGION_MAGIC) {
        if (fresh) {
            init_region(r, cfg);
        } else {
            VGPU_WARN("region %s is not a HAMi shared region (bad magic); remove it when no process uses it", path);
            goto fail;
        }
    } else if (r && r->major_version != VGPU_REGION_MAJOR) {
        VGPU_WARN("region %s has layout %u.%u, this shim writes %u.x; memory limits are per process only",
                  path, r->major_version, r->minor_version, VGPU_REGION_MAJOR);
        goto fail;
    } else if (r) {
        check_config(r, cfg);
    }
    if (!r)
        goto fail_locked;
    vgpu_region_reap(r); /* dead peers' usage out of the monitor's sum; their slots reused first */
    self_slot = vgpu_region_claim_slot(r);
    if (!self_slot) {
        VGPU_WARN("region %s: all %d process slots hold live processes; memory limits are per process only",
                  path, VGPU_MAX_PROCS);
        goto fail;
    }
    vgpu_region_unlock();
    region = r;
    region_fd = fd;
    owner_pid = (int)getpid();
    return 0;
fail:
    munmap(r, sizeof *r);
fail_locked:
    vgpu_region_unlock();
    vgpu_region_lock_set_fd(-1);
    close(fd);
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
        if (!path || !*path)
            path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
        if (!path || !*path)
            path = VGPU_REGION_DEFAULT_PATH;
        snprintf(region_path, sizeof region_path, "%s", path);
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

/* first use in a fork child: own lock (new open file description) and own slot, or none */
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
        if (region_fd >= 0)
            close(region_fd); /* the parent's description: closing our copy leaves its lock alone */
        region_fd = fd;
        vgpu_region_lock_set_fd(fd);
        if (fd >= 0) {
            vgpu_region_lock();
            self_slot = vgpu_region_claim_slot(region);
            vgpu_region_unlock();
        }
        if (!self_slot)
            region = 0;
    }
    owner_pid = (int)getpid();
    __atomic_store_n(&forked, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&attach_mu);
}

VGPU_HIDDEN vgpu_proc_slot_t *vgpu_region_self(void)
{
    if (VGPU_UNLIKELY(__atomic_load_n(&forked, __ATOMIC_ACQUIRE)))
        adopt_after_fork();
    return self_slot;
}

VGPU_HIDDEN void vgpu_region_detach(void)
{
    vgpu_proc_slot_t *s;

    pthread_mutex_lock(&attach_mu);
    s = forked ? 0 : self_slot; /* a child that never used the region owns no slot */
    self_slot = 0;
    if (s && region && owner_pid == (int)getpid()) {
        vgpu_region_lock();
        vgpu_region_free_slot(s);
        vgpu_region_unlock();
    }
    /* the mapping stays: other threads may still read it while the process exits */
    pthread_mutex_unlock(&attach_mu);
}

__attribute__((destructor)) static void region_at_exit(void)
{
    vgpu_region_detach();
}
