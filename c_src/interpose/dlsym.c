/* Exported dlsym: our wrapper for a wrapped name, otherwise exactly the real dlsym, including
 * RTLD_NEXT relative to the caller and stable results on repeated lookups. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>

#include "driver/real.h"
#include "interpose/wrapped.h"
#include "log/log.h"

/* the object containing addr; like glibc, code outside every object (JIT) counts as the main program */
static struct link_map *map_of(const void *addr)
{
    Dl_info info;
    struct link_map *lm = NULL;
    void *main_handle;

    if (dladdr1(addr, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm)
        return lm;
    main_handle = dlopen(NULL, RTLD_LAZY | RTLD_NOLOAD);
    if (!main_handle || dlinfo(main_handle, RTLD_DI_LINKMAP, &lm) != 0)
        lm = NULL;
    if (main_handle)
        dlclose(main_handle);
    return lm;
}

/* RTLD_NEXT relative to OUR caller: the first object after the caller's in load order that
 * defines name itself (the real dlsym would search relative to this shim instead). */
static void *next_after(const void *caller, const char *name)
{
    struct link_map *self = map_of(caller), *l;

    if (!self)
        return NULL;
    for (l = self->l_next; l; l = l->l_next) {
        void *h = dlopen(l->l_name, RTLD_NOLOAD | RTLD_LAZY), *p;
        struct link_map *owner;
        Dl_info info;

        if (!h)
            continue; /* the vDSO and objects of other namespaces */
        p = vgpu_real_dlsym(h, name);
        dlclose(h);
        if (!p)
            continue;
        /* a hit from one of l's dependencies belongs to a later step of the walk */
        if (!dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP))
            return p; /* a TLS variable: not inside any mapping */
        if (owner == l)
            return p;
    }
    return NULL;
}

/* RTLD_DEFAULT as libc resolves it for the caller: the global scope, then the caller's own local
 * scope (a library dlopen'ed RTLD_LOCAL sees its dependencies); libc would use OUR scope instead */
static void *default_for(const void *caller, const char *name)
{
    void *p = vgpu_real_dlsym(RTLD_DEFAULT, name), *h;
    struct link_map *self;

    if (p)
        return p;
    self = map_of(caller);
    if (!self || !self->l_name || !self->l_name[0])
        return NULL; /* the main program's local scope is the global scope */
    h = dlopen(self->l_name, RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return NULL;
    p = vgpu_real_dlsym(h, name);
    dlclose(h);
    return p;
}

/* procaddr.c's wrappers and our own, for dlsym to hand out by name (wrapped.h); at the end of the file */
VGPU_HIDDEN void vgpu_own_cuGetProcAddress(void);
VGPU_HIDDEN void vgpu_own_cuGetProcAddress_v2(void);
static const struct vgpu_handouts own;

VGPU_EXPORT void *dlsym(void *restrict handle, const char *restrict symbol)
{
    const char *name = symbol;
    void *p, *w;

    __asm__("" : "+r"(name)); /* dlfcn.h declares it nonnull; a broken caller must not be "optimised" */
    if (!name)
        return vgpu_real_dlsym(handle, symbol);
    if (handle == RTLD_NEXT)
        p = next_after(__builtin_return_address(0), name);
    else if (handle == RTLD_DEFAULT)
        p = default_for(__builtin_return_address(0), name);
    else
        p = vgpu_real_dlsym(handle, name);
    w = p ? vgpu_wrapper_by_name(name, &own) : NULL;
    if (VGPU_UNLIKELY(vgpu_debug_dlsym))
        vgpu_log(VGPU_LOG_ERROR, "dlsym(%p, %s) -> %p%s", handle, name, w ? w : p, w ? " (our wrapper)" : "");
    return w ? w : p;
}
/* dlfcn.h gives dlsym nothrow/leaf attributes the hidden alias need not repeat */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#endif
VGPU_OWN_ALIAS(dlsym)

static const struct vgpu_handouts own = {(void *)vgpu_own_dlsym, (void *)vgpu_own_cuGetProcAddress,
                                         (void *)vgpu_own_cuGetProcAddress_v2};
