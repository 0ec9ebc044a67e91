/* CUDA_DEVICE_MEMORY_LIMIT_<i> per device, CUDA_DEVICE_MEMORY_LIMIT as the fallback (HAMi's names). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "limits/limits.h"
#include "limits/parse.h"

static uint64_t env_limit[VGPU_MAX_DEVICES];
static int env_valid = 1;
static char env_error[256];

static int load_one(const char *var, uint64_t *out)
{
    const char *val = getenv(var);
    const char *why = "";

    if (!val)
        return 0;
    if (vgpu_limit_parse(val, out, &why) == 0)
        return 1;
    if (env_valid) /* report the first offender; one is enough to fix the pod */
        snprintf(env_error, sizeof env_error, "invalid %s='%.64s': %s; fix the pod's limit", var, val, why);
    env_valid = 0;
    *out = 0;
    return 0;
}

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_loaded;

static void load_env(void)
{
    char name[64];
    uint64_t fallback = 0;
    int i;

    load_one("CUDA_DEVICE_MEMORY_LIMIT", &fallback);
    for (i = 0; i < VGPU_MAX_DEVICES; i++) {
        uint64_t v;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        env_limit[i] = load_one(name, &v) ? v : fallback;
    }
    __atomic_store_n(&env_loaded, 1, __ATOMIC_RELEASE);
}

/* Called by our constructor, and again by every accessor: another library's constructor may
 * call into CUDA before ours has run. */
VGPU_HIDDEN void vgpu_limits_load_env(void)
{
    if (VGPU_UNLIKELY(!__atomic_load_n(&env_loaded, __ATOMIC_ACQUIRE)))
        pthread_once(&env_once, load_env);
}

VGPU_HIDDEN uint64_t vgpu_limits_env(int dev)
{
    vgpu_limits_load_env();
    return (dev >= 0 && dev < VGPU_MAX_DEVICES) ? env_limit[dev] : 0;
}

VGPU_HIDDEN int vgpu_limits_valid(void)
{
    vgpu_limits_load_env();
    return env_valid;
}

VGPU_HIDDEN const char *vgpu_limits_error(void)
{
    vgpu_limits_load_env();
    return env_error;
}
