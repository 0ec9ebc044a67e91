/* Process lifecycle of the shim: the constructor and the fork handlers. The constructor only reads
 * the environment: no CUDA, no dlopen, no umask, no signal handlers; libcuda.so.1 and
 * libnvidia-ml.so.1 are opened at the first intercepted call into each (driver/resolve.c), so
 * processes that never touch the GPU (everything under ld.so.preload) pay nothing. */
#include <pthread.h>
#include <stdlib.h>

#include "accounting/budget.h"
#include "accounting/overhead.h"
#include "accounting/pool.h"
#include "accounting/table.h"
#include "interpose/wrapped.h"
#include "limits/limits.h"
#include "log/log.h"

static void atfork_prepare(void)
{
    vgpu_table_atfork_prepare();
}

static void atfork_parent(void)
{
    vgpu_table_atfork_parent();
}

/* the child has no CUDA context of its own yet: nothing of the parent's is physically its */
static void atfork_child(void)
{
    vgpu_table_atfork_child();
    vgpu_overhead_atfork_child();
    vgpu_pool_atfork_child();
    vgpu_budget_atfork_child();
}

/* VGPU_DEBUG_DLSYM=1: log every dlsym / cuGetProcAddress answer (field debugging, any build) */
VGPU_HIDDEN int vgpu_debug_dlsym;

__attribute__((constructor)) static void vgpu_ctor(void)
{
    const char *dbg = getenv("VGPU_DEBUG_DLSYM");

    vgpu_debug_dlsym = dbg && dbg[0] == '1';
    vgpu_log_init_from_env();
    vgpu_limits_load_env();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
