/* The table of our wrappers: every OWN hook and every VARIANT spelling of hooks.def, for the entry
 * points that hand functions out indirectly (cuGetProcAddress(_v2) and dlsym). Names are taken
 * with # and ## at the outermost expansion, so cuda.h's `#define cuGetProcAddress
 * cuGetProcAddress_v2` (and its kin) can never turn one spelling into another. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "driver/real.h"
#include "interpose/wrapped.h"

/* hidden aliases of every OWN wrapper (VGPU_OWN_ALIAS) and the VARIANT wrappers */
#define HOOK(name, lib, kind) HOOK_##kind(vgpu_own_##name)
#define VARIANT(name, base) VGPU_HIDDEN void vgpu_own_##name(void);
#define HOOK_PASS(fn)
#define HOOK_STUB(fn)
#define HOOK_OWN(fn) VGPU_HIDDEN void fn(void);
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
#undef HOOK_OWN

/* The wrappers that hand wrappers out (dlsym.c, procaddr.c) call this table, so it does not link to
 * them: their entries carry no address, and those callers pass theirs in (vgpu_handouts). HANDOUT_
 * pastes to `~, 1` for their names only (pasted at the outermost expansion, like the names). */
#define HANDOUT_dlsym ~, 1
#define HANDOUT_cuGetProcAddress ~, 1
#define HANDOUT_cuGetProcAddress_v2 ~, 1
#define IS_HANDOUT_(x, n, ...) n
#define IS_HANDOUT(...) IS_HANDOUT_(__VA_ARGS__, 0, )
#define PICK(c, fn) PICK_(c, fn)
#define PICK_(c, fn) PICK_##c(fn)
#define PICK_0(fn) fn
#define PICK_1(fn) NULL

static const struct wrapped wrapped[] = {
#define HOOK(name, lib, kind) HOOK_##kind(#name, VGPU_IDX_##name, VGPU_LIB_##lib, vgpu_own_##name, HANDOUT_##name)
#define HOOK_OWN(name, idx, lib, fn, probe) {name, idx, lib, PICK(IS_HANDOUT(probe), fn)},
#undef HOOK_PASS
#undef HOOK_STUB
#define HOOK_PASS(name, idx, lib, fn, probe)
#define HOOK_STUB(name, idx, lib, fn, probe)
#define VARIANT(name, base) {#name, -1 - VGPU_VAR_##name, VGPU_LIBOF_##base, vgpu_own_##name},
#include "driver/hooks.def"
#undef HOOK
#undef VARIANT
};

#define NWRAPPED (sizeof wrapped / sizeof wrapped[0])

/* our wrapper of entry i: the table's, or for a handout the caller's (NULL when it passed none) */
static void *wrapper_of(size_t i, const struct vgpu_handouts *own)
{
    if (wrapped[i].wrapper)
        return (void *)wrapped[i].wrapper;
    return wrapped[i].idx == VGPU_IDX_dlsym ? own->dlsym : wrapped[i].idx == VGPU_IDX_cuGetProcAddress ? own->gpa
                                                                                                      : own->gpa_v2;
}

static void *real_of(const struct wrapped *w)
{
    return w->idx >= 0 ? vgpu_real_fn(w->idx) : vgpu_var_fn(-1 - w->idx);
}

/* What the driver's cuGetProcAddress hands out for an entry when that is not the exported
 * address dlsym gives (learnt once, on the first swap; NULL in the usual case where both agree). */
static void *alias[NWRAPPED];
static pthread_once_t alias_once = PTHREAD_ONCE_INIT;

/* "cuMemAlloc_v2" -> ("cuMemAlloc", version 2, per-thread 0); "cuLaunchKernel_ptsz" -> (.., 1, 1) */
static void split_name(const char *name, char *base, size_t n, int *version, int *ptsz)
{
    size_t len = strlen(name);
    const char *u;

    *version = 1;
    *ptsz = 0;
    if (len > 5 && strcmp(name + len - 5, "_ptsz") == 0) {
        *ptsz = 1;
        len -= 5;
    }
    for (u = name + len; u > name && u[-1] >= '0' && u[-1] <= '9'; u--)
        ;
    if (u > name + 2 && u < name + len && u[-1] == 'v' && u[-2] == '_') {
        *version = atoi(u);
        len = (size_t)(u - 2 - name);
    }
    if (len >= n)
        len = n - 1;
    memcpy(base, name, len);
    base[len] = '\0';
}

/* an older ABI of a name we also wrap in a newer version (cuGetProcAddress vs _v2): the driver's
 * answer for the base name at our headers' version belongs to the newer one */
static int superseded(size_t i, const char *base, int version, int ptsz)
{
    char b[128];
    int v, p;
    size_t j;

    for (j = 0; j < NWRAPPED; j++) {
        if (j == i || wrapped[j].lib != VGPU_LIB_CUDA)
            continue;
        split_name(wrapped[j].name, b, sizeof b, &v, &p);
        if (p == ptsz && v > version && strcmp(b, base) == 0)
            return 1;
    }
    return 0;
}

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

/* Ask the driver, as a CUDA runtime will, for every base name we wrap (at the CUDA version of our
 * headers, default and per-thread flags); remember answers that differ from the exported address. */
static void learn_driver_aliases(void)
{
    gpa_v2_fn v2 = (gpa_v2_fn)vgpu_real_fn(VGPU_IDX_cuGetProcAddress_v2);
    gpa_v1_fn v1 = (gpa_v1_fn)vgpu_real_fn(VGPU_IDX_cuGetProcAddress);
    size_t i;

    if (vgpu_is_not_found_stub((void *)v2))
        v2 = NULL;
    if (vgpu_is_not_found_stub((void *)v1))
        v1 = NULL;
    if (!v2 && !v1)
        return;
    for (i = 0; i < NWRAPPED; i++) {
        char base[128];
        int version, ptsz;
        void *p = NULL, *exported;
        cuuint64_t flags;
        CUdriverProcAddressQueryResult st;
        CUresult rc;

        if (wrapped[i].lib != VGPU_LIB_CUDA)
            continue;
        split_name(wrapped[i].name, base, sizeof base, &version, &ptsz);
        if (superseded(i, base, version, ptsz))
            continue;
        flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
        rc = v2 ? v2(base, &p, CUDA_VERSION, flags, &st) : v1(base, &p, CUDA_VERSION, flags);
        exported = real_of(&wrapped[i]);
        if (rc == CUDA_SUCCESS && p && !vgpu_is_not_found_stub(exported) && p != exported)
            alias[i] = p;
    }
}

/* our wrapper when p is the real address of a CUDA function we wrap, else p unchanged */
VGPU_HIDDEN void *vgpu_swap_for_wrapper(void *p, const struct vgpu_handouts *own)
{
    size_t i;
    void *mine;

    if (!p || vgpu_is_not_found_stub(p))
        return p;
    pthread_once(&alias_once, learn_driver_aliases);
    for (i = 0; i < NWRAPPED; i++)
        if (wrapped[i].lib == VGPU_LIB_CUDA && (real_of(&wrapped[i]) == p || alias[i] == p) &&
            (mine = wrapper_of(i, own)))
            return mine;
    return p;
}

VGPU_HIDDEN void *vgpu_wrapper_by_name(const char *name, const struct vgpu_handouts *own)
{
    size_t i;

    /* every wrapped name starts with "cu", "nvml" or is "dlsym": skip the table for the rest */
    if (!((name[0] == 'c' && name[1] == 'u') || name[0] == 'n' || name[0] == 'd'))
        return NULL;
    for (i = 0; i < NWRAPPED; i++)
        if (strcmp(wrapped[i].name, name) == 0)
            return wrapper_of(i, own);
    return NULL;
}
