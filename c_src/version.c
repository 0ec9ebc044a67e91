/* Deploy tools recognise our build by this string in read-only data (docs/node-state.md). */
#include "vgpu.h"

__attribute__((used)) static const char vgpu_ident[] = "vgpu-patch-shim " VGPU_VERSION;
