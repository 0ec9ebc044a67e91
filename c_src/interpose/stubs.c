/* Vendor-only names that are not driver entry points (HOOK kind STUB): exported as harmless
 * no-ops so a program that links against the vendor's library still resolves them. */
#include "vgpu.h"

#define HOOK(name, lib, kind) HOOK_##kind(name)
#define VARIANT(name, base)
#define HOOK_PASS(name)
#define HOOK_OWN(name)
#define HOOK_STUB(name) \
    VGPU_EXPORT int name(void); \
    VGPU_EXPORT int name(void) \
    { \
        return 0; \
    }
#include "driver/hooks.def"
