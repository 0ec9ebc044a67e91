/* A region for a process that lost its container's environment.
 *
 * A shell opened with a scrubbed environment (`env -i`, `su -`, some `kubectl exec` and ssh paths)
 * still gets this library through /etc/ld.so.preload but none of HAMi's variables, so it would run
 * unlimited. HAMi keeps the container's region in the directory of the preloaded library (it sets
 * CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<id>.cache, and /usr/local/vgpu/libvgpu.so is the
 * library), so when neither that variable nor any limit variable is set we look there: exactly one
 * acceptable region is used, and its limits hold; none, or more than one, and nothing is guessed.
 * Acceptable is what shm.c would accept (vgpu_region_distrust, and not a symlink), of the region's
 * size, with the magic and major version of layout 1.2. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

static int acceptable(int dir, const struct stat *dirst, const char *name)
{
    struct stat st;
    vgpu_region_t head;
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK), ok;

    if (fd < 0)
        return 0;
    ok = fstat(fd, &st) == 0 && !vgpu_region_distrust(&st, dirst) && st.st_size == (off_t)sizeof(vgpu_region_t) &&
         pread(fd, &head, offsetof(vgpu_region_t, owner_pid), 0) == (ssize_t)offsetof(vgpu_region_t, owner_pid) &&
         head.initialized_flag == VGPU_REGION_MAGIC && head.major_version == VGPU_REGION_MAJOR;
    close(fd);
    return ok;
}

static int find_beside_library(char *out, size_t n)
{
    Dl_info info;
    char dir[4096], *slash;
    struct dirent *e;
    DIR *d;
    struct stat dirst;
    int dfd, found = 0, have_dir;

    if (!dladdr((void *)find_beside_library, &info) || !info.dli_fname ||
        snprintf(dir, sizeof dir, "%s", info.dli_fname) >= (int)sizeof dir || !(slash = strrchr(dir, '/')))
        return -1;
    *slash = 0;
    if (!(d = opendir(*dir ? dir : "/")))
        return -1;
    dfd = dirfd(d);
    have_dir = fstat(dfd, &dirst) == 0;
    while ((e = readdir(d)) && found < 2) {
        size_t len = strlen(e->d_name);
        if (len > 6 && !strcmp(e->d_name + len - 6, ".cache") && acceptable(dfd, have_dir ? &dirst : 0, e->d_name) &&
            ++found == 1 && snprintf(out, n, "%s/%s", dir, e->d_name) >= (int)n)
            found = 2; /* a path we cannot hold is no answer */
    }
    closedir(d);
    if (found > 1)
        VGPU_WARN("no CUDA_DEVICE_MEMORY_SHARED_CACHE or limit variable set, and %s holds several regions; using "
                  "none of them (set CUDA_DEVICE_MEMORY_SHARED_CACHE to say which)", dir);
    else if (found == 1)
        VGPU_INFO("no CUDA_DEVICE_MEMORY_SHARED_CACHE or limit variable set: holding the limits of %s, the one "
                  "region beside this library", out);
    return found == 1 ? 0 : -1;
}

VGPU_HIDDEN void vgpu_region_choose_path(char *out, size_t n)
{
    const char *env = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");

    if (env && *env)
        snprintf(out, n, "%s", env);
    else if (vgpu_limits_any_set() || find_beside_library(out, n) != 0)
        snprintf(out, n, "%s", VGPU_REGION_DEFAULT_PATH);
}
