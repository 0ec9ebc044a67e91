/* The real-entry-point table, expanded from hooks.def. vgpu_real[] itself lives in
 * trampolines.S (one 8-byte slot per HOOK line, in file order) so PASS trampolines can jump
 * through their slot with no index arithmetic; C reaches the same slots by VGPU_IDX_<name>. */
#ifndef VGPU_REAL_H
#define VGPU_REAL_H

#include "vgpu.h"

enum vgpu_lib { VGPU_LIB_CUDA = 0, VGPU_LIB_NVML = 1, VGPU_LIB_LIBC = 2 };

enum vgpu_hook_idx {
#define HOOK(name, lib, kind) VGPU_IDX_##name,
#define VARIANT(name, base)
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
    VGPU_NHOOKS
};

/* VGPU_LIBOF_<name>: the library of a hook, a constant, so a variant's entry can name its base's */
enum vgpu_hook_lib {
#define HOOK(name, lib, kind) VGPU_LIBOF_##name = VGPU_LIB_##lib,
#define VARIANT(name, base)
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

/* the VARIANT spellings of OWN entries: not exported, slots kept in C */
enum vgpu_var_idx {
#define HOOK(name, lib, kind)
#define VARIANT(name, base) VGPU_VAR_##name,
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
    VGPU_NVARS
};

VGPU_HIDDEN extern void *vgpu_real[VGPU_NHOOKS];
VGPU_HIDDEN extern void *vgpu_real_var[VGPU_NVARS];

/* Slow path of every lookup: initialise the symbol's library once, then return its slot
 * (never NULL: a symbol missing from the real library yields a NOT_FOUND stub). */
VGPU_HIDDEN void *vgpu_slot_resolve(int idx);
VGPU_HIDDEN void *vgpu_var_resolve(int var);
/* load libcuda / libnvidia-ml and fill their slots (pthread_once); 0 when the library is there */
VGPU_HIDDEN int vgpu_lib_init(int lib);
/* > 0 while this thread is inside an NVML opening or shutdown that is not the application's own call (the
 * shim's own session, or NVML calling its entry points through the global scope): interpose/nvml_init.c does
 * not count those as the application's */
VGPU_HIDDEN extern __thread int vgpu_nvml_inner;
VGPU_HIDDEN void *vgpu_resolve(const char *name, int lib, int mandatory);
VGPU_HIDDEN int vgpu_is_not_found_stub(const void *fn);
/* the libc dlsym our own exported dlsym shadows */
VGPU_HIDDEN void *vgpu_real_dlsym(void *handle, const char *name);
VGPU_HIDDEN void *vgpu_lib_handle(int lib);

/* `REAL(cuMemAlloc_v2)` is the real function, typed from cudaTypedefs-style PFN_ names below. */
static inline void *vgpu_real_fn(int idx)
{
    void *fn = __atomic_load_n(&vgpu_real[idx], __ATOMIC_ACQUIRE);
    return VGPU_LIKELY(fn != 0) ? fn : vgpu_slot_resolve(idx);
}

static inline void *vgpu_var_fn(int var)
{
    void *fn = __atomic_load_n(&vgpu_real_var[var], __ATOMIC_ACQUIRE);
    return VGPU_LIKELY(fn != 0) ? fn : vgpu_var_resolve(var);
}

#define REAL(name) ((__typeof__(&name))vgpu_real_fn(VGPU_IDX_##name))

/* hidden alias of an exported OWN wrapper: its address without going through the GOT, so a
 * second preloaded copy can never be handed out in our place */
#define VGPU_OWN_ALIAS(name) \
    extern __typeof__(name) vgpu_own_##name __attribute__((alias(#name), visibility("hidden")));

#endif
