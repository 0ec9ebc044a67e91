/* In-process A/B of the shim's added host cost on a real GPU (run by bench/gpu_inprocess.py).
 *
 * Across processes, the same bare call varies by 10-20% on a shared VM (CPU placement, clocks), which
 * hides differences of 100 ns. Here one process, preloaded with libvgpu.so, holds two pointers per
 * entry point: the shim's (dlsym, as an application gets it) and the driver's own (read from
 * libcuda's .dynsym on disk plus its load address, bypassing every hook). Rounds alternate which
 * goes first; each metric's median per-op time over the rounds is printed as one JSON line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#define CK(call) \
    do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) { fprintf(stderr, "%s = %d at line %d\n", #call, rc_, __LINE__); exit(1); } } while (0)

static const Elf64_Sym *dynsym;
static const char *dynstr;
static size_t nsyms;
static ElfW(Addr) base;

/* map libcuda's file and find its dynamic symbol table (section headers are present in the driver) */
static void load_dynsym(void *handle)
{
    struct link_map *lm;
    struct stat st;
    const unsigned char *img;
    const Elf64_Ehdr *eh;
    const Elf64_Shdr *sh;
    int fd, i;

    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || (fd = open(lm->l_name, O_RDONLY)) < 0 || fstat(fd, &st))
        exit(3);
    img = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (img == MAP_FAILED)
        exit(3);
    eh = (const Elf64_Ehdr *)img;
    sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    for (i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == SHT_DYNSYM) {
            dynsym = (const Elf64_Sym *)(img + sh[i].sh_offset);
            nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
            dynstr = (const char *)(img + sh[sh[i].sh_link].sh_offset);
        }
    base = lm->l_addr;
    if (!dynsym)
        exit(3);
}

static void *driver_own(const char *name)
{
    size_t i;
    for (i = 0; i < nsyms; i++)
        if (dynsym[i].st_value && !strcmp(dynstr + dynsym[i].st_name, name))
            return (void *)(base + dynsym[i].st_value);
    fprintf(stderr, "%s not in libcuda's .dynsym\n", name);
    exit(3);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct api {
    __typeof__(&cuLaunchKernel) launch;
    __typeof__(&cuMemGetInfo_v2) info;
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) release;
};

enum { M_LAUNCH, M_INFO, M_PAIR4K, M_PAIR1M, NMET };
static const char *const names[NMET] = {"launch_ns", "meminfo_ns", "pair_4k_ns", "pair_1m_ns"};

static void measure(const struct api *a, CUfunction fn, CUstream s, double out[NMET])
{
    __typeof__(&cuStreamSynchronize) sync = (__typeof__(&cuStreamSynchronize))driver_own("cuStreamSynchronize");
    CUdeviceptr p;
    size_t f, t;
    double t0, acc = 0;
    int i, b;

    for (b = 0; b < 8; b++) { /* batches of 256 launches, then a sync: host time only */
        t0 = now_ns();
        for (i = 0; i < 256; i++)
            CK(a->launch(fn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        acc += now_ns() - t0;
        CK(sync(s));
    }
    out[M_LAUNCH] = acc / (8 * 256);
    t0 = now_ns();
    for (i = 0; i < 2000; i++)
        CK(a->info(&f, &t));
    out[M_INFO] = (now_ns() - t0) / 2000;
    t0 = now_ns();
    for (i = 0; i < 500; i++) {
        CK(a->alloc(&p, 4096));
        CK(a->release(p));
    }
    out[M_PAIR4K] = (now_ns() - t0) / 500;
    t0 = now_ns();
    for (i = 0; i < 50; i++) {
        CK(a->alloc(&p, 1 << 20));
        CK(a->release(p));
    }
    out[M_PAIR1M] = (now_ns() - t0) / 50;
}

static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 41, r, m, v;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    struct api api[2]; /* 0: the driver's own entry points, 1: what dlsym hands out (the shim's) */
    double *res[2][NMET], one[NMET];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream s;

    if (!lib || rounds < 1)
        return 2;
    load_dynsym(lib);
#define BOTH(field, sym) \
    api[0].field = (__typeof__(api[0].field))driver_own(#sym); \
    api[1].field = (__typeof__(api[1].field))dlsym(lib, #sym);
    BOTH(launch, cuLaunchKernel) BOTH(info, cuMemGetInfo_v2) BOTH(alloc, cuMemAlloc_v2) BOTH(release, cuMemFree_v2)
    if (api[0].alloc == api[1].alloc)
        fprintf(stderr, "warning: dlsym returned the driver's own cuMemAlloc_v2: is the shim preloaded?\n");
    CK(((__typeof__(&cuInit))dlsym(lib, "cuInit"))(0));
    CK(((__typeof__(&cuDeviceGet))dlsym(lib, "cuDeviceGet"))(&dev, 0));
    CK(((__typeof__(&cuDevicePrimaryCtxRetain))dlsym(lib, "cuDevicePrimaryCtxRetain"))(&ctx, dev));
    CK(((__typeof__(&cuCtxSetCurrent))dlsym(lib, "cuCtxSetCurrent"))(ctx));
    CK(((__typeof__(&cuModuleLoadData))dlsym(lib, "cuModuleLoadData"))(&mod, ptx));
    CK(((__typeof__(&cuModuleGetFunction))dlsym(lib, "cuModuleGetFunction"))(&fn, mod, "noop"));
    CK(((__typeof__(&cuStreamCreate))dlsym(lib, "cuStreamCreate"))(&s, CU_STREAM_NON_BLOCKING));
    for (v = 0; v < 2; v++)
        for (m = 0; m < NMET; m++)
            res[v][m] = calloc(rounds, sizeof(double));
    measure(&api[0], fn, s, one); /* warm-up, both paths */
    measure(&api[1], fn, s, one);
    for (r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            v = (r + k) % 2; /* alternate which variant goes first */
            measure(&api[v], fn, s, one);
            for (m = 0; m < NMET; m++)
                res[v][m][r] = one[m];
        }
    printf("{");
    for (m = 0; m < NMET; m++) {
        for (v = 0; v < 2; v++)
            qsort(res[v][m], rounds, sizeof(double), cmp);
        printf("%s\"%s\": [%.1f, %.1f]", m ? ", " : "", names[m], res[0][m][rounds / 2], res[1][m][rounds / 2]);
    }
    printf("}\n");
    return 0;
}
