/* The table of our wrappers (every OWN hook and PTSZ variant), for the entry points that hand
 * functions out indirectly: cuGetProcAddress(_v2) and dlsym. Kept apart from the wrappers so
 * their hidden aliases can be declared here with one generic type. */
#include <stddef.h>
#include <string.h>

#include "interpose/real.h"
#include "interpose/wrapped.h"

/* hidden aliases of every OWN wrapper (VGPU_OWN_ALIAS) and the PTSZ variant wrappers */
#define HOOK(name, lib, kind) HOOK_##kind(name)
#define PTSZ(name, base) VGPU_HIDDEN void vgpu_own_##name(void);
#define HOOK_PASS(name)
#define HOOK_STUB(name)
#define HOOK_OWN(name) VGPU_HIDDEN void vgpu_own_##name(void);
#include "interpose/hooks.def"
#undef HOOK
#undef PTSZ
#undef HOOK_OWN

static const struct wrapped wrapped[] = {
#define HOOK(name, lib, kind) HOOK_##kind(name, lib)
#define HOOK_OWN(name, lib) {#name, VGPU_IDX_##name, VGPU_LIB_##lib, vgpu_own_##name},
#undef HOOK_PASS
#undef HOOK_STUB
#define HOOK_PASS(name, lib)
#define HOOK_STUB(name, lib)
#define PTSZ(name, base) {#name, -1 - VGPU_VAR_##name, VGPU_LIB_CUDA, vgpu_own_##name},
#include "interpose/hooks.def"
#undef HOOK
#undef PTSZ
};

#define NWRAPPED (sizeof wrapped / sizeof wrapped[0])

static void *real_of(const struct wrapped *w)
{
    return w->idx >= 0 ? vgpu_real_fn(w->idx) : vgpu_var_fn(-1 - w->idx);
}

/* our wrapper when p is the real address of a CUDA function we wrap, else p unchanged */
VGPU_HIDDEN void *vgpu_swap_for_wrapper(void *p)
{
    size_t i;

    if (!p || vgpu_is_not_found_stub(p))
        return p;
    for (i = 0; i < NWRAPPED; i++)
        if (wrapped[i].lib == VGPU_LIB_CUDA && real_of(&wrapped[i]) == p)
            return (void *)wrapped[i].wrapper;
    return p;
}

VGPU_HIDDEN void *vgpu_wrapper_by_name(const char *name)
{
    size_t i;

    /* every wrapped name starts with "cu", "nvml" or is "dlsym": skip the table for the rest */
    if (!((name[0] == 'c' && name[1] == 'u') || name[0] == 'n' || name[0] == 'd'))
        return NULL;
    for (i = 0; i < NWRAPPED; i++)
        if (strcmp(wrapped[i].name, name) == 0)
            return (void *)wrapped[i].wrapper;
    return NULL;
}

