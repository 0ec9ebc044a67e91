/* Whether a region file, or what it holds, may be trusted at all (design.md's threat model): the
 * file's kind, owner and names (a symlink never gets here: it is opened O_NOFOLLOW), and a process
 * table that makes sense. shm.c refuses what fails (one warning), find.c passes it over and heir.c
 * inherits nothing from it. Reads only what it is given: it calls nothing else of region/. */
#include <sys/stat.h>
#include <unistd.h>

#include "region/region.h"

VGPU_HIDDEN int vgpu_region_distrust(const struct stat *st, const struct stat *dir)
{
    if (!S_ISREG(st->st_mode))
        return VGPU_DISTRUST_TYPE;
    /* another uid's file: of this container only when the directory is one of its own (not sticky:
     * a sticky directory is where unrelated users meet, and there anyone may have put it) */
    if (st->st_uid != geteuid() && st->st_uid != 0 && (!dir || (dir->st_mode & S_ISVTX)))
        return VGPU_DISTRUST_OWNER;
    if (st->st_nlink != 1) /* a second name for some other file (we would initialise or share its bytes) */
        return VGPU_DISTRUST_LINKS;
    if (!(st->st_mode & S_IWUSR)) /* its owner made it read-only: root could still write it, not what was meant */
        return VGPU_DISTRUST_READONLY;
    return 0;
}

VGPU_HIDDEN const char *vgpu_region_table_insane(const vgpu_region_t *r)
{
    int i, d, n = r->proc_num;

    if (n < 0 || n > VGPU_MAX_PROCS)
        return "proc_num out of range";
    if (r->device_num > VGPU_MAX_DEVICES)
        return "device_num out of range";
    for (i = 0; i < n; i++) {
        const vgpu_proc_slot_t *s = &r->procs[i];
        if (s->status != VGPU_SLOT_FREE && s->status != VGPU_SLOT_RUNNING && s->status != VGPU_SLOT_SUSPENDED)
            return "a slot with an unknown status";
        if (s->status == VGPU_SLOT_FREE)
            continue;
        if (s->pid <= 0)
            return "a live slot without a pid";
        for (d = 0; d < VGPU_MAX_DEVICES; d++)
            if (s->used[d].total > VGPU_SANE_BYTES)
                return "a slot claiming more than 4 PiB";
    }
    return 0;
}
