/* Pool charges (see pool.h). A small table of the pools this process allocated from, under one
 * mutex that covers only the bookkeeping and one attribute read (no allocation ever runs under
 * it): two settles of one pool must not apply readings out of order. */
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "accounting/budget.h"
#include "accounting/pool.h"
#include "driver/real.h"
#include "log/log.h"

#define NPOOLS 128

static struct {
    CUmemoryPool pool;
    int dev;
    uint64_t charged;
} pools[NPOOLS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int attr(CUmemoryPool pool, CUmemPool_attribute a, uint64_t *out)
{
    cuuint64_t v = 0;

    if (REAL(cuMemPoolGetAttribute)(pool, a, &v) != CUDA_SUCCESS)
        return -1;
    *out = v;
    return 0;
}

VGPU_HIDDEN CUmemoryPool vgpu_pool_current(int dev)
{
    CUdevice d;
    CUmemoryPool pool = NULL;

    if (dev < 0 || REAL(cuDeviceGet)(&d, dev) != CUDA_SUCCESS || REAL(cuDeviceGetMemPool)(&pool, d) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

VGPU_HIDDEN uint64_t vgpu_pool_need(CUmemoryPool pool, uint64_t bytes)
{
    uint64_t reserved, used;

    if (!pool || attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) ||
        attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) || used > reserved)
        return bytes;
    return reserved - used >= bytes ? 0 : bytes - (reserved - used);
}

/* lock held: the slot of pool, a free one for it when absent and dev >= 0, else -1 */
static int slot_of(CUmemoryPool pool, int dev)
{
    int i, free_slot = -1;

    for (i = 0; i < NPOOLS; i++) {
        if (pools[i].pool == pool)
            return i;
        if (!pools[i].pool && free_slot < 0)
            free_slot = i;
    }
    if (free_slot >= 0 && dev >= 0) {
        pools[free_slot].pool = pool;
        pools[free_slot].dev = dev;
        pools[free_slot].charged = 0;
    } else if (dev >= 0) {
        VGPU_WARN("more than %d memory pools in use: further pools are charged per allocation", NPOOLS);
    }
    return dev >= 0 ? free_slot : -1;
}

/* lock held */
static int settle_slot(int i)
{
    uint64_t reserved;

    if (attr(pools[i].pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0)
        return -1;
    if (reserved > pools[i].charged)
        vgpu_budget_force(pools[i].dev, reserved - pools[i].charged);
    else
        vgpu_budget_release(pools[i].dev, pools[i].charged - reserved);
    pools[i].charged = reserved;
    return 0;
}

VGPU_HIDDEN int vgpu_pool_settle(CUmemoryPool pool, int dev)
{
    int i, rc = -1;

    if (!pool || dev < 0)
        return -1;
    pthread_mutex_lock(&lock);
    i = slot_of(pool, dev);
    if (i >= 0) {
        rc = settle_slot(i);
        if (rc != 0 && !pools[i].charged)
            pools[i].pool = NULL; /* never charged this way: leave it to per-allocation charges */
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

VGPU_HIDDEN void vgpu_pool_settle_dev(int dev)
{
    int i;

    pthread_mutex_lock(&lock);
    for (i = 0; i < NPOOLS; i++)
        if (pools[i].pool && pools[i].dev == dev)
            settle_slot(i);
    pthread_mutex_unlock(&lock);
}

VGPU_HIDDEN void vgpu_pool_forget(CUmemoryPool pool)
{
    int i;

    pthread_mutex_lock(&lock);
    i = slot_of(pool, -1);
    if (i >= 0) {
        vgpu_budget_release(pools[i].dev, pools[i].charged);
        pools[i].pool = NULL;
        pools[i].charged = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* a forked child holds none of its parent's pools */
VGPU_HIDDEN void vgpu_pool_atfork_child(void)
{
    memset(pools, 0, sizeof pools);
    pthread_mutex_init(&lock, NULL);
}
