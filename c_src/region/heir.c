/* A region file that replaces a deleted one inherits its live processes.
 *
 * When the region's path is removed (a cleanup of /tmp, a sidecar recreating it) while processes
 * of the container still hold memory, those processes keep charging the old, unlinked file, and
 * the next process would create a new one with a fresh budget. So whoever initialises a file
 * looks for the file it replaces first: every process of ours keeps a descriptor open on its
 * region (the lock's), which /proc/<pid>/fd shows as "<path> (deleted)" and lets a process of the
 * same uid (or root) open. The live slots of that file are copied into the new one before its
 * magic is written, so its first user already sees what they hold.
 *
 * A copy carries no check word: its owner holds its liveness byte on the old file, not this one,
 * so peers judge a copy by its pid, alive while that process maps the old file (ident.c counts a
 * mapping of "<path> (deleted)" as one of the region). A copy is a snapshot: what its owner frees
 * stays counted (the safe direction) until the owner takes its copy over (shm.c, on noticing the
 * new file) or exits. Vendor processes keep no descriptor open: their usage is not inherited. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log/log.h"
#include "region/region.h"

/* the old file behind /proc/<pid>/fd/<fd>, mapped read-only, when it is one to inherit from */
static const vgpu_region_t *open_old(const char *fdpath, const struct stat *mine, int *fd_out)
{
    struct stat st;
    const vgpu_region_t *old;
    int fd = open(fdpath, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 0 ||
        st.st_size < (off_t)sizeof(vgpu_region_t) || (st.st_uid != geteuid() && st.st_uid != 0) ||
        (st.st_dev == mine->st_dev && st.st_ino == mine->st_ino))
        goto no;
    old = mmap(0, sizeof *old, PROT_READ, MAP_SHARED, fd, 0);
    if (old == MAP_FAILED)
        goto no;
    if (__atomic_load_n(&old->initialized_flag, __ATOMIC_ACQUIRE) == VGPU_REGION_MAGIC &&
        old->major_version == VGPU_REGION_MAJOR && !vgpu_region_table_insane(old)) {
        *fd_out = fd;
        return old;
    }
    munmap((void *)old, sizeof *old);
no:
    close(fd);
    return 0;
}

/* the live slots of `old` into `r` (not yet visible to anyone): same index, no check word */
static int copy_slots(vgpu_region_t *r, const vgpu_region_t *old, int old_fd)
{
    int i, n = old->proc_num, copied = 0;
    vgpu_ident_t id;

    if (n > VGPU_LEDGER_SLOT)
        n = VGPU_LEDGER_SLOT;
    for (i = 0; i < n; i++) {
        const vgpu_proc_slot_t *s = &old->procs[i];
        vgpu_proc_slot_t *t = &r->procs[i];
        if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == VGPU_SLOT_FREE)
            continue;
        if (vgpu_stamp_read(s, &id) && vgpu_live_probe(old_fd, id.nonce) == 0)
            continue; /* its owner is gone */
        memcpy(t, s, sizeof *t);
        __atomic_store_n(&t->used[0].unused[0], 0, __ATOMIC_RELAXED); /* the check word */
        t->seqlock = 0;
        r->proc_num = i + 1;
        copied++;
    }
    return copied;
}

VGPU_HIDDEN void vgpu_region_inherit(vgpu_region_t *r, int fd, const char *path)
{
    char want[4200], link[4200], fdpath[64];
    struct stat mine;
    struct dirent *p, *f;
    DIR *procs, *fds;
    int done = 0, self = (int)getpid();

    if (fstat(fd, &mine) != 0 || snprintf(want, sizeof want, "%s (deleted)", path) >= (int)sizeof want)
        return;
    if (!(procs = opendir("/proc")))
        return;
    while (!done && (p = readdir(procs))) {
        int pid = atoi(p->d_name);
        char dir[64];
        if (pid <= 0 || pid == self)
            continue;
        snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
        if (!(fds = opendir(dir)))
            continue; /* another uid's process, or gone */
        while (!done && (f = readdir(fds))) {
            const vgpu_region_t *old;
            int ofd;
            ssize_t n;
            if (f->d_name[0] == '.')
                continue;
            snprintf(fdpath, sizeof fdpath, "/proc/%d/fd/%d", pid, atoi(f->d_name));
            n = readlink(fdpath, link, sizeof link - 1);
            if (n <= 0 || (size_t)n != strlen(want) || memcmp(link, want, (size_t)n))
                continue;
            if (!(old = open_old(fdpath, &mine, &ofd)))
                continue;
            done = copy_slots(r, old, ofd);
            if (done)
                VGPU_WARN("region %s replaced a deleted one that live processes still use: it inherits their "
                          "%d slot(s) (pid %d's)", path, done, pid);
            munmap((void *)old, sizeof *old);
            close(ofd);
        }
        closedir(fds);
    }
    closedir(procs);
}
