/* A fake libnvidia-ml.so.1 for the shim's tests: the physical devices behind the fake libcuda,
 * handles are pointers to a per-device record. NVML sees every physical device in physical order
 * (CUDA's FAKE_CUDA_ORDER does not apply to it, as CUDA_VISIBLE_DEVICES does not apply to NVML),
 * and this process's memory as the fake libcuda accounts it (looked up at run time, so either
 * library loads without the other).
 *
 * Env knobs:
 *   FAKE_CUDA_DEVICES=N            CUDA's device count (default 2)
 *   FAKE_CUDA_MEM_MB=M             memory per device (default 1024)
 *   FAKE_CUDA_ORDER=1,0            CUDA's ordinal -> physical map: here only its largest index counts
 *                                  (unset: CUDA_VISIBLE_DEVICES gives the map, visible.h)
 *   FAKE_CUDA_PHYSICAL_DEVICES=N   NVML's device count; default max(FAKE_CUDA_DEVICES or 2,
 *                                  1 + the largest index in FAKE_CUDA_ORDER)
 *   FAKE_NVML_PID_OFFSET=K         this process's pid as NVML reports it: getpid() + K (a container's
 *                                  pid namespace, NVML answering with host pids; default 0)
 *   FAKE_NVML_OTHERS=pid:MiB,...   other processes on every device (counted in its used memory); the
 *                                  pid "self" is this process's getpid() (a neighbour whose host pid
 *                                  equals our pid inside the container)
 *   FAKE_NVML_OTHERS_WITH_US=1     the others appear only while this process has a context on the
 *                                  device (a neighbour that starts during our context creation)
 *   FAKE_NVML_OTHERS_LEAVE=1       the others are gone once this process has a context on the device
 *                                  (a neighbour that frees its memory during our context creation)
 *   FAKE_NVML_SELF_LATE_MS=N       this process is listed only N ms after it is first seen with a
 *                                  context (NVML listing a new process late)
 *   FAKE_NVML_OTHERS_GROW=1        each process listing shows the others 2 MiB more than the one before
 *                                  (busy neighbours, allocating all the time)
 *   FAKE_GPU=FILE                  the other processes of the shared time-sliced GPU (sim_gpu.h) are
 *                                  listed as well, holding no memory, as the real NVML lists every
 *                                  process with a context; nvmlDeviceGetUtilizationRates gives that GPU's
 *                                  utilisation (without FAKE_GPU: NVML_ERROR_NOT_SUPPORTED)
 * Fault injection:
 *   FAKE_NVML_PROCS_FAIL=1         the process-list calls fail (NVML_ERROR_UNKNOWN), as on hosts
 *                                  where NVML cannot see other pid namespaces' processes
 *   FAKE_NVML_DELAY_MS=N           the memory and process-list calls take N ms more (a loaded NVML)
 *   FAKE_NVML_SELF_ABSURD=1        this process's entry reports 2^53 bytes used
 * Test hook: fake_nvml_queries (memory and process-list calls so far).
 * Link with -ldl where dlopen is not in libc (glibc < 2.34). */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* the unversioned names are exported here as the v1 ABIs */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nvml.h>
#include "sim_gpu.h" /* FAKE_GPU: the shared GPU's processes */
#include "visible.h" /* CUDA_VISIBLE_DEVICES, for which of our devices a CUDA ordinal is */

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 16
#define MAXOTHERS 16

struct nvmlDevice_st {
    unsigned index;
};

static struct nvmlDevice_st devs[MAXDEV];
static unsigned ndev = 2;
static unsigned long long total = 1024ull << 20;
static int inited; /* NVML counts its openings: each nvmlInit* one, each nvmlShutdown one less */
static int order[MAXDEV]; /* as fake_cuda.c parses FAKE_CUDA_ORDER: CUDA ordinal -> physical */
static int norder = -1;   /* -1: unset, the identity */
static long pid_offset;
static struct {
    unsigned pid;
    unsigned long long bytes;
} others[MAXOTHERS];
static unsigned nothers;
static int procs_fail;
static unsigned delay_ms;
static int others_with_us;
static int others_leave;
static int self_absurd;
static unsigned self_late_ms;
static int others_grow;
static unsigned long long grown; /* what the others gained, FAKE_NVML_OTHERS_GROW */

static unsigned long queries;

/* every memory or process-list query passes here */
static void slow(void)
{
    __atomic_fetch_add(&queries, 1, __ATOMIC_RELAXED);
    if (delay_ms)
        usleep(delay_ms * 1000u);
}

/* test hook: memory and process-list queries so far */
__attribute__((visibility("default"))) unsigned long fake_nvml_queries(void)
{
    return __atomic_load_n(&queries, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void fake_config(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    char *end;
    if (s)
        ndev = (unsigned)atoi(s) > MAXDEV ? MAXDEV : (unsigned)atoi(s);
    s = getenv("FAKE_CUDA_ORDER");
    if (s) {
        norder = 0;
        while (*s && norder < MAXDEV) {
            long v = strtol(s, &end, 10);
            if (end != s && v >= 0 && v < MAXDEV) {
                order[norder++] = (int)v;
                if ((unsigned)v + 1 > ndev)
                    ndev = (unsigned)v + 1;
            }
            s = end;
            while (*s && *s != ',')
                s++;
            if (*s == ',')
                s++;
        }
    }
    s = getenv("FAKE_CUDA_PHYSICAL_DEVICES");
    if (s)
        ndev = (unsigned)atoi(s) > MAXDEV ? MAXDEV : (unsigned)atoi(s);
    if (norder < 0) /* NVML sees every device; CUDA's ordinals follow CUDA_VISIBLE_DEVICES */
        norder = fake_visible_order((int)ndev, order, MAXDEV);
    s = getenv("FAKE_CUDA_MEM_MB");
    if (s)
        total = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_NVML_PROCS_FAIL");
    procs_fail = s && *s == '1';
    s = getenv("FAKE_NVML_DELAY_MS");
    if (s)
        delay_ms = (unsigned)strtoul(s, NULL, 10);
    s = getenv("FAKE_NVML_SELF_ABSURD");
    self_absurd = s && *s == '1';
    s = getenv("FAKE_NVML_OTHERS_WITH_US");
    others_with_us = s && *s == '1';
    s = getenv("FAKE_NVML_OTHERS_LEAVE");
    others_leave = s && *s == '1';
    s = getenv("FAKE_NVML_OTHERS_GROW");
    others_grow = s && *s == '1';
    s = getenv("FAKE_NVML_SELF_LATE_MS");
    if (s)
        self_late_ms = (unsigned)strtoul(s, NULL, 10);
    s = getenv("FAKE_NVML_PID_OFFSET");
    if (s)
        pid_offset = strtol(s, NULL, 10);
    for (s = getenv("FAKE_NVML_OTHERS"); s && *s && nothers < MAXOTHERS;) {
        unsigned long pid = strtoul(s, &end, 10);
        if (strncmp(s, "self:", 5) == 0) {
            pid = (unsigned long)getpid();
            end = (char *)s + 4;
        }
        if (end != s && *end == ':') {
            const char *m = end + 1;
            unsigned long long mib = strtoull(m, &end, 10);
            if (end != m) {
                others[nothers].pid = (unsigned)pid;
                others[nothers++].bytes = mib << 20;
            }
        }
        s = end;
        while (*s && *s != ',')
            s++;
        if (*s == ',')
            s++;
    }
    for (unsigned i = 0; i < MAXDEV; i++)
        devs[i].index = i;
}

/* ---- the fake libcuda's books, if it is loaded: dlopen NOLOAD never loads it for us. The shim
 * under test interposes dlsym and passes these (unknown to it) names through. ---- */
typedef int (*has_ctx_fn)(int);
typedef unsigned long long (*used_phys_fn)(int);
static has_ctx_fn p_has_ctx;
static used_phys_fn p_used_phys;

static int cuda_books(void)
{
    void *h;
    if (__atomic_load_n(&p_used_phys, __ATOMIC_ACQUIRE))
        return 1;
    h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return 0;
    has_ctx_fn hc = (has_ctx_fn)dlsym(h, "fake_has_ctx");
    used_phys_fn up = (used_phys_fn)dlsym(h, "fake_used_physical");
    if (!hc || !up) { /* some other libcuda.so.1: nothing to report */
        dlclose(h);
        return 0;
    }
    /* the handle stays open: the library must outlive the pointers (a racing second open only
     * bumps its refcount) */
    __atomic_store_n(&p_has_ctx, hc, __ATOMIC_RELAXED);
    __atomic_store_n(&p_used_phys, up, __ATOMIC_RELEASE);
    return 1;
}

static unsigned long long own_bytes(unsigned p)
{
    return cuda_books() ? p_used_phys((int)p) : 0;
}

/* a context on any CUDA ordinal that maps onto physical device p */
static int own_ctx(unsigned p)
{
    if (!cuda_books())
        return 0;
    if (norder < 0)
        return p_has_ctx((int)p);
    for (int i = 0; i < norder; i++)
        if ((unsigned)order[i] == p && p_has_ctx(i))
            return 1;
    return 0;
}

static int valid(nvmlDevice_t d)
{
    return d && d >= devs && d < devs + ndev;
}

static void uuid_of(unsigned p, char *out, size_t len)
{
    fake_uuid_string(p, out, len);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    __atomic_add_fetch(&inited, 1, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}

/* as the real NVML's, these open through nvmlInitWithFlags called through the global scope (its PLT), so a
 * preloaded library exporting that name sees NVML's own call */
static nvmlReturn_t open_with_flags(void)
{
    nvmlReturn_t (*with_flags)(unsigned int) = (nvmlReturn_t(*)(unsigned int))dlsym(RTLD_DEFAULT,
                                                                                   "nvmlInitWithFlags");
    return with_flags ? with_flags(0) : nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return open_with_flags();
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return open_with_flags();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&inited, 1, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n)
{
    return nvmlDeviceGetCount_v2(n);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d)
{
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!i || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (len < NVML_DEVICE_UUID_ASCII_LEN)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    uuid_of(d->index, uuid, len);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    char s[NVML_DEVICE_UUID_ASCII_LEN];
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < ndev; i++) {
        uuid_of(i, s, sizeof s);
        if (strcmp(s, uuid) == 0) {
            *d = &devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- memory and processes: this process (while it has a context there) and FAKE_NVML_OTHERS ---- */
static int others_there(unsigned p)
{
    if (others_leave)
        return !own_ctx(p);
    return !others_with_us || own_ctx(p);
}

/* listed: has a context there, and first seen with it at least FAKE_NVML_SELF_LATE_MS ago */
static int self_listed(unsigned p)
{
    static unsigned long long first_ms[MAXDEV];
    struct timespec ts;
    unsigned long long now, first;

    if (!own_ctx(p))
        return 0;
    if (!self_late_ms)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull + 1;
    first = 0;
    if (!__atomic_compare_exchange_n(&first_ms[p], &first, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) && first)
        return now - first >= self_late_ms;
    return 0;
}

static unsigned long long used_on(unsigned p)
{
    unsigned long long used = own_bytes(p);
    if (others_there(p))
        for (unsigned i = 0; i < nothers; i++)
            used += others[i].bytes + __atomic_load_n(&grown, __ATOMIC_RELAXED);
    return used > total ? total : used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    slow();
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!m || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total;
    m->used = used_on(d->index);
    m->free = total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    slow();
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!m || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total;
    m->reserved = 0;
    m->used = used_on(d->index);
    m->free = total - m->used;
    return NVML_SUCCESS;
}

/* the FAKE_GPU file, mapped read-only; NULL without one */
static const struct sim_gpu *sim_file(void)
{
    static struct sim_gpu *gpu;
    const char *path = getenv("FAKE_GPU");
    int fd;

    if (!gpu && path && *path && (fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
        void *m = mmap(0, sizeof *gpu, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m != MAP_FAILED)
            gpu = m;
    }
    return gpu;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    const struct sim_gpu *gpu = sim_file();

    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!u || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu)
        return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = (unsigned)(__atomic_load_n(&gpu->util_ppm, __ATOMIC_RELAXED) / 10000);
    u->memory = 0;
    return NVML_SUCCESS;
}

/* the other processes of the FAKE_GPU file, up to max; their pids into pids */
static unsigned sim_others(unsigned *pids, unsigned max)
{
    const struct sim_gpu *gpu = sim_file();
    unsigned n = 0;
    int i;

    for (i = 0; gpu && i < SIM_PROCS && n < max; i++) {
        int pid = __atomic_load_n(&gpu->proc[i].pid, __ATOMIC_RELAXED);
        if (pid && pid != getpid())
            pids[n++] = (unsigned)pid;
    }
    return n;
}

/* NVML's protocol: *count in is the room, out the number there is; too little room (infos may be
 * NULL with *count == 0 to ask) is INSUFFICIENT_SIZE with the number needed. size picks the
 * record: the v1 one (pid, usedGpuMemory) or the v2 one (= v3: MIG instance ids as well). */
static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, void *infos, size_t size)
{
    unsigned n = 0, need, nvisible, sim_pids[SIM_PROCS], nsim;
    int own;
    slow();
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!count || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (procs_fail)
        return NVML_ERROR_UNKNOWN;
    own = self_listed(d->index);
    nvisible = others_there(d->index) ? nothers : 0;
    if (others_grow)
        __atomic_fetch_add(&grown, 2ull << 20, __ATOMIC_RELAXED);
    nsim = sim_others(sim_pids, SIM_PROCS);
    need = nvisible + (own ? 1u : 0u) + nsim;
    if (*count < need) {
        *count = need;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (need && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < need; i++) {
        unsigned pid;
        unsigned long long bytes;
        if (own && i == 0) {
            pid = (unsigned)((long)getpid() + pid_offset);
            bytes = self_absurd ? 1ull << 53 : own_bytes(d->index);
        } else if (i >= need - nsim) {
            pid = sim_pids[i - (need - nsim)];
            bytes = 0;
        } else {
            pid = others[i - (own ? 1u : 0u)].pid;
            bytes = others[i - (own ? 1u : 0u)].bytes + __atomic_load_n(&grown, __ATOMIC_RELAXED);
        }
        if (size == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *r = (nvmlProcessInfo_v1_t *)infos + i;
            r->pid = pid;
            r->usedGpuMemory = bytes;
        } else {
            nvmlProcessInfo_v2_t *r = (nvmlProcessInfo_v2_t *)infos + i;
            r->pid = pid;
            r->usedGpuMemory = bytes;
            r->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            r->computeInstanceId = 0xFFFFFFFFu;
        }
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

/* the graphics and MPS listings show the same processes (a fake GPU has one kind of client) */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                          nvmlProcessInfo_v1_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_v1_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

/* the spellings newer than the vendor's surface (the shim hands them out by dlsym only) */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                             nvmlProcessInfo_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                               nvmlProcessInfo_t *infos)
{
    return processes(d, count, infos, sizeof *infos);
}
