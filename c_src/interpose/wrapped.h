/* Our wrappers, looked up by the real address they replace or by name. */
#ifndef VGPU_WRAPPED_H
#define VGPU_WRAPPED_H

#include "vgpu.h"

struct wrapped {
    const char *name;
    int idx; /* VGPU_IDX_* for exported hooks, -1 - VGPU_VAR_* for variants */
    int lib;
    void (*wrapper)(void);
};

/* the wrappers that hand wrappers out, as their callers know them (NULL: not known to it): the table
 * lists them by name but does not link to them, since they call it */
struct vgpu_handouts {
    void *dlsym, *gpa, *gpa_v2; /* dlsym, cuGetProcAddress, cuGetProcAddress_v2 */
};
/* our wrapper when p is the real address of a CUDA function we wrap, else p unchanged */
VGPU_HIDDEN void *vgpu_swap_for_wrapper(void *p, const struct vgpu_handouts *own);
/* our wrapper for a wrapped name (OWN hook or VARIANT spelling), else NULL */
VGPU_HIDDEN void *vgpu_wrapper_by_name(const char *name, const struct vgpu_handouts *own);

/* VGPU_DEBUG_DLSYM=1 in the environment */
VGPU_HIDDEN extern int vgpu_debug_dlsym;

#endif
