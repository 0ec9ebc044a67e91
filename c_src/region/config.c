/* This process's view of the region's settings, from the environment HAMi's plugin sets:
 * memory limits through the shared limits parser, CUDA_DEVICE_SM_LIMIT[_<i>] and CUDA_TASK_PRIORITY. */
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

/* the limits parser's value (a malformed one already failed the process closed, see limits/env.c) */
VGPU_HIDDEN uint64_t vgpu_env_sm_limit(int dev)
{
    return vgpu_limits_env_sm(dev);
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
