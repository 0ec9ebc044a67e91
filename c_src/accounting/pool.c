/* The pools' slots, the measuring floor of pool charges (see pool.h): what each pool is charged and
 * holds, settled to the reserve the driver reports. Each pool this process allocated from has a slot; slots live in
 * chunks that never move (a slot's lock stays put), found through the table (pool -> slot).
 *
 * Locks: `lock` covers slot assignment only; a slot's `grow` covers its charge and is held across
 * one allocation's driver call (pool_charge.c). Order: grow, then lock; `lock` is never held while waiting for a
 * grow (vgpu_pool_settle_dev only tries it), so a thread refused inside vgpu_pool_begin (which
 * settles the device's pools) cannot deadlock with another pool's allocation. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "accounting/budget.h"
#include "accounting/pool.h"
#include "accounting/pool_slots.h"
#include "accounting/table.h"
#include "driver/real.h"
#include "log/log.h"

#define CHUNK 64
#define NCHUNKS (VGPU_POOLS_MAX / CHUNK)
/* a pool's step before any of its growths shows it: what pools grow by on current drivers (H200,
 * driver 580). A driver that grows by less is insured for more than it takes until the step is
 * learnt; one that grows by more is caught after the call (undo) and learnt. */
#define FIRST_STEP (32ull << 20)


static struct vgpu_pool_slot *chunks[NCHUNKS];
static int nslots; /* slots in chunks so far (under lock) */
static uint64_t dev_step[VGPU_MAX_DEVICES]; /* the step the device's pools last showed (a new pool's first guess) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pooled_live; /* pool allocations in the table: frees skip the lookup while 0 */

VGPU_HIDDEN struct vgpu_pool_slot *vgpu_pool_at(int i)
{
    return &chunks[i / CHUNK][i % CHUNK];
}

VGPU_HIDDEN int vgpu_pool_attr(CUmemoryPool pool, CUmemPool_attribute a, uint64_t *out)
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

/* lock held: a free slot (a new chunk when all are taken), -1 when VGPU_POOLS_MAX are in use */
static int free_slot(void)
{
    int i;

    for (i = 0; i < nslots; i++)
        if (!vgpu_pool_at(i)->pool)
            return i;
    if (nslots == VGPU_POOLS_MAX)
        return -1;
    if (nslots % CHUNK == 0) {
        struct vgpu_pool_slot *c = calloc(CHUNK, sizeof *c);
        if (!c)
            return -1;
        for (i = 0; i < CHUNK; i++)
            pthread_mutex_init(&c[i].grow, NULL);
        chunks[nslots / CHUNK] = c;
    }
    __atomic_store_n(&nslots, nslots + 1, __ATOMIC_RELEASE); /* after its chunk exists */
    return nslots - 1;
}

/* the slot of a live pool, assigned on first use; -1 when none is left */
VGPU_HIDDEN int vgpu_pool_slot_of(CUmemoryPool pool, int dev)
{
    static int warned;
    int i, d;
    uint64_t cached;

    if (vgpu_table_get((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &d, &cached)) {
        i = (int)cached;
        if (i < __atomic_load_n(&nslots, __ATOMIC_ACQUIRE) && vgpu_pool_at(i)->pool == pool && !vgpu_pool_at(i)->dead)
            return i; /* checked again under its grow lock */
    }
    pthread_mutex_lock(&lock);
    for (i = 0; i < nslots; i++)
        if (vgpu_pool_at(i)->pool == pool && !vgpu_pool_at(i)->dead)
            break;
    if (i == nslots && (i = free_slot()) >= 0) {
        struct vgpu_pool_slot *s = vgpu_pool_at(i);
        s->pool = pool;
        s->dev = dev;
        s->dead = 0;
        s->charged = s->out = s->step_low = s->step_cap = 0;
    }
    pthread_mutex_unlock(&lock);
    if (i >= 0)
        vgpu_table_put((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, dev, (uint64_t)i);
    else if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        VGPU_WARN("more than %d memory pools in use: allocations from further pools are refused", VGPU_POOLS_MAX);
    return i;
}

/* ---- the pool's growth step (pool.h). A pool grows by its shortfall rounded up to a step S, a power
 * of two. A growth g for a shortfall n leaves g - n < S (also when another thread trimmed or freed
 * in between: the driver's shortfall then differs from ours by what the growth shows), so S is at
 * least the next power of two above g - n; and S divides g, so S is at most the lowest set bit of g.
 * The charge rounds up to the larger bound that both allow: S itself after a growth or two. (A
 * fragmented spare the driver could not use makes g - n look larger: the bound is then at most the
 * lowest set bit of every growth seen.) ---- */
static uint64_t pow2_above(uint64_t x)
{
    return x >= (1ull << 63) ? 1ull << 63 : x ? 1ull << (64 - __builtin_clzll(x)) : 1;
}

/* the step the slot's growths allow (0: none seen) */
static uint64_t step_of(const struct vgpu_pool_slot *s)
{
    return s->step_cap && s->step_cap < s->step_low ? s->step_cap : s->step_low;
}

VGPU_HIDDEN void vgpu_pool_learn_step(struct vgpu_pool_slot *s, uint64_t grew, uint64_t shortfall)
{
    uint64_t low = pow2_above(grew > shortfall ? grew - shortfall : 0), cap = grew & -grew;

    if (low > s->step_low)
        s->step_low = low;
    if (!s->step_cap || cap < s->step_cap)
        s->step_cap = cap;
    if (s->dev >= 0 && s->dev < VGPU_MAX_DEVICES)
        __atomic_store_n(&dev_step[s->dev], step_of(s), __ATOMIC_RELAXED);
}

/* the step to charge by: the slot's, or before it grew at all, the one the device's pools showed
 * (else FIRST_STEP) */
VGPU_HIDDEN uint64_t vgpu_pool_step_for(const struct vgpu_pool_slot *s)
{
    uint64_t step = step_of(s);

    if (!step && s->dev >= 0 && s->dev < VGPU_MAX_DEVICES)
        step = __atomic_load_n(&dev_step[s->dev], __ATOMIC_RELAXED);
    return step ? step : FIRST_STEP;
}

/* what the pool grows by for `bytes` it cannot take from its spare: rounded up to its step */
VGPU_HIDDEN uint64_t vgpu_pool_growth_for(const struct vgpu_pool_slot *s, uint64_t bytes)
{
    uint64_t step = vgpu_pool_step_for(s), r;

    if (!bytes || step < 2)
        return bytes;
    r = (bytes + step - 1) & ~(step - 1);
    return r < bytes ? bytes : r; /* saturated: the limit refuses it anyway */
}

/* grow held: charge dev exactly the reserve the driver reports; what was given back (0 when it grew) */
VGPU_HIDDEN uint64_t vgpu_pool_settle_to(struct vgpu_pool_slot *s, uint64_t reserved)
{
    uint64_t back = s->charged > reserved ? s->charged - reserved : 0;

    if (reserved > s->charged)
        vgpu_budget_force(s->dev, reserved - s->charged); /* grown behind our back (an imported pool) */
    else
        vgpu_budget_release(s->dev, back);
    s->charged = reserved;
    return back;
}

/* grow held, the slot emptied: give it back */
static void drop(struct vgpu_pool_slot *s, CUmemoryPool pool)
{
    vgpu_budget_release(s->dev, s->charged);
    if (!s->dead) /* a dead slot's handle left the table at destroy: the driver may have reused it */
        vgpu_table_take((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &(int){0}, &(uint64_t){0});
    pthread_mutex_lock(&lock);
    s->pool = NULL;
    s->charged = s->out = 0;
    s->dead = 0;
    pthread_mutex_unlock(&lock);
}




VGPU_HIDDEN void vgpu_pool_record(struct vgpu_pool_slot *s, int slot, CUdeviceptr p, uint64_t bytes)
{
    if (vgpu_table_put(p, VGPU_K_POOLED, slot, bytes) == 0) {
        s->out += bytes;
        __atomic_fetch_add(&pooled_live, 1, __ATOMIC_RELAXED);
    }
}

VGPU_HIDDEN struct vgpu_pooled vgpu_pool_untrack(CUdeviceptr p)
{
    struct vgpu_pooled t = {-1, 0};
    int slot;

    if (p && __atomic_load_n(&pooled_live, __ATOMIC_RELAXED) &&
        vgpu_table_take(p, VGPU_K_POOLED, &slot, &t.size))
        t.slot = slot;
    return t;
}

VGPU_HIDDEN void vgpu_pool_untrack_done(CUresult rc, CUdeviceptr p, struct vgpu_pooled t)
{
    struct vgpu_pool_slot *s;
    uint64_t back;

    if (t.slot < 0)
        return;
    if (rc != CUDA_SUCCESS) {
        vgpu_table_put(p, VGPU_K_POOLED, t.slot, t.size); /* the driver kept it */
        return;
    }
    __atomic_fetch_sub(&pooled_live, 1, __ATOMIC_RELAXED);
    s = vgpu_pool_at(t.slot);
    pthread_mutex_lock(&s->grow);
    s->out -= t.size < s->out ? t.size : s->out;
    if (s->dead) { /* the driver gives a destroyed pool's memory back allocation by allocation */
        back = t.size < s->charged ? t.size : s->charged;
        vgpu_budget_release(s->dev, back);
        s->charged -= back;
        if (!s->out)
            drop(s, s->pool);
    }
    pthread_mutex_unlock(&s->grow);
}

VGPU_HIDDEN uint64_t vgpu_pool_settle_dev(int dev)
{
    uint64_t reserved, charged, back = 0;
    int i;

    pthread_mutex_lock(&lock);
    for (i = 0; i < nslots; i++) {
        struct vgpu_pool_slot *s = vgpu_pool_at(i);
        if (!s->pool || s->dead || s->dev != dev)
            continue;
        if (pthread_mutex_trylock(&s->grow) == 0) {
            if (vgpu_pool_attr(s->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0)
                back += vgpu_pool_settle_to(s, reserved);
            pthread_mutex_unlock(&s->grow);
        } else if (vgpu_pool_attr(s->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0 &&
                   (charged = __atomic_load_n(&s->charged, __ATOMIC_RELAXED)) > reserved) {
            back += charged - reserved; /* an allocation in flight settles it itself, later */
        }
    }
    pthread_mutex_unlock(&lock);
    return back;
}

VGPU_HIDDEN void vgpu_pool_forget(CUmemoryPool pool)
{
    int d, i;
    uint64_t cached, keep;
    struct vgpu_pool_slot *s;

    if (!vgpu_table_get((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &d, &cached))
        return; /* never allocated from through us */
    i = (int)cached;
    s = vgpu_pool_at(i);
    pthread_mutex_lock(&s->grow);
    if (s->pool == pool && !s->dead) {
        keep = s->out < s->charged ? s->out : s->charged;
        vgpu_budget_release(s->dev, s->charged - keep); /* the spare reserve went back at once */
        s->charged = keep;
        if (s->out) {
            s->dead = 1;
            vgpu_table_take((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &d, &cached); /* the handle may be reused */
        } else {
            drop(s, pool);
        }
    }
    pthread_mutex_unlock(&s->grow);
}

/* a forked child holds none of its parent's pools */
VGPU_HIDDEN void vgpu_pool_atfork_child(void)
{
    int i;

    for (i = 0; i < nslots; i++) {
        struct vgpu_pool_slot *s = vgpu_pool_at(i);
        memset(s, 0, sizeof *s);
        pthread_mutex_init(&s->grow, NULL);
    }
    pthread_mutex_init(&lock, NULL);
    pooled_live = 0;
}
