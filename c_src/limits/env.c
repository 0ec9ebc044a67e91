/* CUDA_DEVICE_MEMORY_LIMIT_<i> per device, CUDA_DEVICE_MEMORY_LIMIT as the fallback (HAMi's names);
 * the same for CUDA_DEVICE_SM_LIMIT[_<i>]. A malformed value of either kind fails closed: the
 * process refuses every allocation with one error line naming the variable (never unlimited). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "limits/limits.h"
#include "limits/parse.h"

static uint64_t env_limit[VGPU_MAX_DEVICES];
static uint64_t env_sm[VGPU_MAX_DEVICES]; /* percent 1..99, 0 = none (0 and >= 100 as written) */
static int env_valid = 1;
static int env_any; /* some limit variable is present, valid or not */
static char env_error[256];

static int load_one(const char *var, uint64_t *out)
{
    const char *val = getenv(var);
    const char *why = "";
    int sm = var[12] == 'S'; /* CUDA_DEVICE_SM_LIMIT... vs CUDA_DEVICE_MEMORY_LIMIT... */

    if (!val)
        return 0;
    env_any = 1;
    if ((sm ? vgpu_sm_parse(val, out, &why) : vgpu_limit_parse(val, out, &why)) == 0)
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

    uint64_t sm_fallback = 0;

    load_one("CUDA_DEVICE_MEMORY_LIMIT", &fallback);
    load_one("CUDA_DEVICE_SM_LIMIT", &sm_fallback);
    for (i = 0; i < VGPU_MAX_DEVICES; i++) {
        uint64_t v;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        env_limit[i] = load_one(name, &v) ? v : fallback;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        v = load_one(name, &v) ? v : sm_fallback;
        env_sm[i] = vgpu_sm_norm(v);
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

VGPU_HIDDEN uint64_t vgpu_limits_env_sm(int dev)
{
    vgpu_limits_load_env();
    return (dev >= 0 && dev < VGPU_MAX_DEVICES) ? env_sm[dev] : 0;
}

VGPU_HIDDEN uint64_t vgpu_limit_in_force(uint64_t region, uint64_t env)
{
    return (!region || (env && env < region)) ? env : region;
}

VGPU_HIDDEN uint64_t vgpu_sm_norm(uint64_t percent)
{
    return percent >= 100 ? 0 : percent;
}

VGPU_HIDDEN int vgpu_limits_any_set(void)
{
    vgpu_limits_load_env();
    return env_any;
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
