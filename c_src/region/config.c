/* This process's view of the region's settings, from the environment HAMi's plugin sets:
 * memory limits through the shared limits parser, CUDA_DEVICE_SM_LIMIT[_<i>] and CUDA_TASK_PRIORITY. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "limits/limits.h"
#include "log/log.h"
#include "region/region.h"

/* decimal 0..2^31; -1 when malformed */
static long parse_int(const char *s)
{
    long v = 0;

    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

static uint64_t sm_one(const char *var, uint64_t fallback)
{
    const char *s = getenv(var);
    long v;

    if (!s)
        return fallback;
    v = parse_int(s);
    if (v < 0) {
        VGPU_WARN("ignoring %s='%.32s': want a whole percent 0-100 (0 or >= 100 = no SM limit)", var, s);
        return fallback;
    }
    return v >= 100 ? 0 : (uint64_t)v;
}

static uint64_t sm_env[VGPU_MAX_DEVICES];
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;

static void load_sm(void)
{
    char name[64];
    uint64_t all = sm_one("CUDA_DEVICE_SM_LIMIT", 0);
    int d;

    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", d);
        sm_env[d] = sm_one(name, all);
    }
}

VGPU_HIDDEN uint64_t vgpu_env_sm_limit(int dev)
{
    pthread_once(&sm_once, load_sm); /* parsed (and complained about) once per process */
    return (dev >= 0 && dev < VGPU_MAX_DEVICES) ? sm_env[dev] : 0;
}

VGPU_HIDDEN void vgpu_region_config_from_env(vgpu_region_config_t *cfg)
{
    const char *prio = getenv("CUDA_TASK_PRIORITY");
    long p = prio ? parse_int(prio) : 1;
    int d;

    for (d = 0; d < VGPU_MAX_DEVICES; d++) {
        cfg->limit[d] = vgpu_limits_env(d);
        cfg->sm_limit[d] = vgpu_env_sm_limit(d);
    }
    if (p < 0) {
        VGPU_WARN("ignoring CUDA_TASK_PRIORITY='%.32s': want a whole number; using 1", prio);
        p = 1;
    }
    cfg->priority = (int)p;
}
