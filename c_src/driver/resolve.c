/* Init and the one resolver. The constructor only reads the environment; libcuda.so.1 and
 * libnvidia-ml.so.1 are opened at the first intercepted call into each (pthread_once), so
 * processes that never touch the GPU (everything under ld.so.preload) pay nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <nvml.h>

#include "driver/real.h"
#include "limits/limits.h"
#include "log/log.h"

VGPU_HIDDEN void *vgpu_real_var[VGPU_NVARS];

static const char *const hook_name[VGPU_NHOOKS] = {
#define HOOK(name, lib, kind) #name,
#define VARIANT(name, base)
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

static const unsigned char hook_lib[VGPU_NHOOKS] = {
#define HOOK(name, lib, kind) VGPU_LIB_##lib,
#define VARIANT(name, base)
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

static const char *const var_name[VGPU_NVARS] = {
#define HOOK(name, lib, kind)
#define VARIANT(name, base) #name,
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

static const unsigned char var_lib[VGPU_NVARS] = {
#define HOOK(name, lib, kind)
#define VARIANT(name, base) VGPU_LIBOF_##base,
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

/* What a PASS symbol becomes when the real library lacks it (or is missing). */
static CUresult cuda_not_found(void)
{
    return CUDA_ERROR_NOT_FOUND;
}

static nvmlReturn_t nvml_not_found(void)
{
    return NVML_ERROR_FUNCTION_NOT_FOUND;
}

VGPU_HIDDEN int vgpu_is_not_found_stub(const void *fn)
{
    return fn == (const void *)cuda_not_found || fn == (const void *)nvml_not_found;
}

static void *not_found_stub(int lib)
{
    return lib == VGPU_LIB_NVML ? (void *)nvml_not_found : (void *)cuda_not_found;
}

/* ---- the real dlsym: a versioned lookup, never a GLIBC_PRIVATE symbol ---- */
#if defined(__x86_64__)
#define DLSYM_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define DLSYM_VERSION "GLIBC_2.17"
#endif

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

VGPU_HIDDEN void *vgpu_real_dlsym(void *handle, const char *name)
{
    dlsym_fn fn = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (VGPU_UNLIKELY(!fn)) {
        /* idempotent: racing threads store the same value */
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", DLSYM_VERSION);
        if (!fn) {
            VGPU_ERROR("cannot find libc's dlsym@%s: %s; this libc is not supported", DLSYM_VERSION, dlerror());
            abort();
        }
        __atomic_store_n(&real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    }
    return fn(handle, name);
}

/* ---- library handles ---- */
static void *lib_handle[2];
static pthread_once_t lib_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
VGPU_HIDDEN __thread int vgpu_nvml_inner;
static __thread int in_lib_init; /* a library constructor calling back into us must not deadlock */

VGPU_HIDDEN void *vgpu_lib_handle(int lib)
{
    return (lib == VGPU_LIB_CUDA || lib == VGPU_LIB_NVML) ? __atomic_load_n(&lib_handle[lib], __ATOMIC_ACQUIRE) : NULL;
}

static int inside_us(const void *p)
{
    Dl_info self, other;
    if (!p || !dladdr((void *)inside_us, &self) || !dladdr(p, &other))
        return 0;
    return self.dli_fbase == other.dli_fbase;
}

VGPU_HIDDEN void *vgpu_resolve(const char *name, int lib, int mandatory)
{
    void *handle = vgpu_lib_handle(lib);
    void *p;

    if (lib == VGPU_LIB_LIBC)
        return strcmp(name, "dlsym") == 0 ? (void *)real_dlsym_ptr : NULL;
    if (!handle)
        return NULL;
    p = vgpu_real_dlsym(handle, name);
    if (!p && mandatory)
        VGPU_ERROR("%s not found in the real %s: %s", name, lib == VGPU_LIB_NVML ? "libnvidia-ml.so.1" : "libcuda.so.1",
                   dlerror());
    if (p && inside_us(p)) {
        VGPU_ERROR("real %s resolved into this shim itself: two copies of libvgpu are loaded; fix ld.so.preload / "
                   "LD_PRELOAD so only one remains", name);
        abort();
    }
    VGPU_DEBUG("resolved %s -> %p", name, p);
    return p;
}

/* name is one of the comma-separated entries of list */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    const char *p;

    for (p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static void fill_slots(int lib)
{
    int i;
    const char *skip = getenv("VGPU_IGNORE_SYMBOLS"); /* field debugging: comma list left unresolved */

    for (i = 0; i < VGPU_NHOOKS; i++) {
        void *p = NULL;
        if (hook_lib[i] != lib)
            continue;
        if (!skip || !listed(skip, hook_name[i]))
            p = vgpu_resolve(hook_name[i], lib, 0);
        __atomic_store_n(&vgpu_real[i], p ? p : not_found_stub(lib), __ATOMIC_RELEASE);
    }
    for (i = 0; i < VGPU_NVARS; i++) {
        void *p;
        if (var_lib[i] != lib)
            continue;
        p = vgpu_resolve(var_name[i], lib, 0);
        __atomic_store_n(&vgpu_real_var[i], p ? p : not_found_stub(lib), __ATOMIC_RELEASE);
    }
}

static void open_lib(int lib, const char *soname)
{
    void *h;

    in_lib_init = 1;
    h = dlopen(soname, RTLD_LAZY);
    in_lib_init = 0;
    if (!h)
        VGPU_INFO("cannot open %s: %s", soname, dlerror());
    __atomic_store_n(&lib_handle[lib], h, __ATOMIC_RELEASE);
    fill_slots(lib);
}

static void init_cuda(void)
{
    vgpu_log_init_from_env(); /* our constructor may not have run yet */
    if (!vgpu_limits_valid())
        VGPU_ERROR("%s", vgpu_limits_error());
    open_lib(VGPU_LIB_CUDA, "libcuda.so.1");
}

static void init_nvml(void)
{
    open_lib(VGPU_LIB_NVML, "libnvidia-ml.so.1");
}

VGPU_HIDDEN int vgpu_lib_init(int lib)
{
    if (lib == VGPU_LIB_LIBC) {
        vgpu_real_dlsym(NULL, "vgpu-no-such-symbol"); /* forces the lookup of the real dlsym */
        __atomic_store_n(&vgpu_real[VGPU_IDX_dlsym], (void *)real_dlsym_ptr, __ATOMIC_RELEASE);
        return 0;
    }
    if (in_lib_init)
        return -1;
    pthread_once(&lib_once[lib], lib == VGPU_LIB_CUDA ? init_cuda : init_nvml);
    return vgpu_lib_handle(lib) ? 0 : -1;
}

VGPU_HIDDEN void *vgpu_slot_resolve(int idx)
{
    void *fn;

    if (idx < 0 || idx >= VGPU_NHOOKS)
        abort();
    vgpu_lib_init(hook_lib[idx]);
    fn = __atomic_load_n(&vgpu_real[idx], __ATOMIC_ACQUIRE);
    return fn ? fn : not_found_stub(hook_lib[idx]); /* re-entered during dlopen: not filled yet */
}

VGPU_HIDDEN void *vgpu_var_resolve(int var)
{
    void *fn;

    if (var < 0 || var >= VGPU_NVARS)
        abort();
    vgpu_lib_init(var_lib[var]);
    fn = __atomic_load_n(&vgpu_real_var[var], __ATOMIC_ACQUIRE);
    return fn ? fn : not_found_stub(var_lib[var]);
}
