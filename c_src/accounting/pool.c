/* Pool charges (see pool.h). Each pool this process allocated from has a slot; slots live in
 * chunks that never move (a slot's lock stays put), found through the table (pool -> slot).
 *
 * Locks: `lock` covers slot assignment only; a slot's `grow` covers its charge and is held across
 * one allocation's driver call. Order: grow, then lock; `lock` is never held while waiting for a
 * grow (vgpu_pool_settle_dev only tries it), so a thread refused inside vgpu_pool_begin (which
 * settles the device's pools) cannot deadlock with another pool's allocation. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/pool.h"
#include "accounting/table.h"
#include "driver/real.h"
#include "log/log.h"

#define CHUNK 64
#define NCHUNKS (VGPU_POOLS_MAX / CHUNK)
/* a pool's step before any of its growths shows it: what pools grow by on current drivers (H200,
 * driver 580). A driver that grows by less is insured for more than it takes until the step is
 * learnt; one that grows by more is caught after the call (undo) and learnt. */
#define FIRST_STEP (32ull << 20)

struct slot {
    pthread_mutex_t grow;
    CUmemoryPool pool; /* NULL: free */
    int dev;
    int dead;          /* destroyed with allocations outstanding: only frees remain */
    uint64_t charged;  /* what dev is charged for this pool (under grow) */
    uint64_t out;      /* bytes of its allocations made through us and not freed (under grow) */
    uint64_t step_low; /* the pool grows in steps of at least this (0: none seen yet; under grow) */
    uint64_t step_cap; /* ... and, as far as its growths show, of at most this (0: none seen) */
};

static struct slot *chunks[NCHUNKS];
static int nslots; /* slots in chunks so far (under lock) */
static uint64_t dev_step[VGPU_MAX_DEVICES]; /* the step the device's pools last showed (a new pool's first guess) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pooled_live; /* pool allocations in the table: frees skip the lookup while 0 */

static struct slot *at(int i)
{
    return &chunks[i / CHUNK][i % CHUNK];
}

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

/* lock held: a free slot (a new chunk when all are taken), -1 when VGPU_POOLS_MAX are in use */
static int free_slot(void)
{
    int i;

    for (i = 0; i < nslots; i++)
        if (!at(i)->pool)
            return i;
    if (nslots == VGPU_POOLS_MAX)
        return -1;
    if (nslots % CHUNK == 0) {
        struct slot *c = calloc(CHUNK, sizeof *c);
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
static int slot_of(CUmemoryPool pool, int dev)
{
    static int warned;
    int i, d;
    uint64_t cached;

    if (vgpu_table_get((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &d, &cached)) {
        i = (int)cached;
        if (i < __atomic_load_n(&nslots, __ATOMIC_ACQUIRE) && at(i)->pool == pool && !at(i)->dead)
            return i; /* checked again under its grow lock */
    }
    pthread_mutex_lock(&lock);
    for (i = 0; i < nslots; i++)
        if (at(i)->pool == pool && !at(i)->dead)
            break;
    if (i == nslots && (i = free_slot()) >= 0) {
        struct slot *s = at(i);
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
static uint64_t step_of(const struct slot *s)
{
    return s->step_cap && s->step_cap < s->step_low ? s->step_cap : s->step_low;
}

static void learn_step(struct slot *s, uint64_t grew, uint64_t shortfall)
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
static uint64_t step_for(const struct slot *s)
{
    uint64_t step = step_of(s);

    if (!step && s->dev >= 0 && s->dev < VGPU_MAX_DEVICES)
        step = __atomic_load_n(&dev_step[s->dev], __ATOMIC_RELAXED);
    return step ? step : FIRST_STEP;
}

/* what the pool grows by for `bytes` it cannot take from its spare: rounded up to its step */
static uint64_t growth_for(const struct slot *s, uint64_t bytes)
{
    uint64_t step = step_for(s), r;

    if (!bytes || step < 2)
        return bytes;
    r = (bytes + step - 1) & ~(step - 1);
    return r < bytes ? bytes : r; /* saturated: the limit refuses it anyway */
}

/* grow held: charge dev exactly the reserve the driver reports; what was given back (0 when it grew) */
static uint64_t settle_to(struct slot *s, uint64_t reserved)
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
static void drop(struct slot *s, CUmemoryPool pool)
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

/* the pool's reserve and what of `bytes` its spare lacks (a `used` read before a trim may exceed
 * the reserve after it: the spare is then none) */
static void note_spare(struct vgpu_pool_op *op, uint64_t reserved, uint64_t used, uint64_t bytes)
{
    op->reserved = reserved;
    op->spare = reserved > used ? reserved - used : 0;
    op->shortfall = op->spare >= bytes ? 0 : bytes - op->spare;
}

/* grow held, the insurance refused: steps of the pool's spare that nothing uses are given back to
 * make room (the pool would keep them up to its release threshold; being refused is worse). 1
 * when the reserve went down. */
static int trim_spare(struct slot *s, struct vgpu_pool_op *op, CUmemoryPool pool, uint64_t used, uint64_t bytes)
{
    uint64_t reserved;

    if (REAL(cuMemPoolTrimTo)(pool, used) != CUDA_SUCCESS ||
        attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 || reserved >= op->reserved)
        return 0;
    settle_to(s, reserved);
    note_spare(op, reserved, used, bytes);
    return 1;
}

VGPU_HIDDEN CUresult vgpu_pool_begin(struct vgpu_pool_op *op, int dev, CUmemoryPool pool, uint64_t bytes)
{
    uint64_t reserved, used;
    struct slot *s;
    CUresult rc;

    op->dev = dev;
    op->slot = -1;
    op->need = op->spare = op->ahead = 0;
    op->pool = pool;
    if (dev < 0)
        return CUDA_SUCCESS; /* host pool or unknown device: not charged */
    if (!pool) {
        op->need = bytes;
        return vgpu_charge(dev, bytes);
    }
    if ((op->slot = slot_of(pool, dev)) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s = at(op->slot);
    pthread_mutex_lock(&s->grow);
    if (s->pool != pool || s->dead || attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0 ||
        attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0 || used > reserved) {
        /* no reserve to read (or destroyed meanwhile): charged per allocation, like linear memory */
        pthread_mutex_unlock(&s->grow);
        op->slot = -1;
        op->need = bytes;
        return vgpu_charge(dev, bytes);
    }
    settle_to(s, reserved); /* trimmed since the last allocation: the charge follows */
    note_spare(op, reserved, used, bytes);
    /* the spare is charged, and until the call returns maybe trimmed by a synchronize in another
     * thread (a reading settles only the pools no allocation is growing): in flight */
    op->ahead = op->spare;
    vgpu_budget_ahead(dev, op->ahead);
    /* Insured as if none of the spare could serve it: a spare in pieces smaller than the
     * allocation, or freed on another stream and not yet reusable, lets the driver grow the pool
     * where the spare looked enough. Grown past the limit and undone, that was over the limit for
     * a moment, thousands of times a second in a full container on an H200. What the pool does not
     * grow is given back in vgpu_pool_end. */
    op->need = growth_for(s, bytes);
    rc = vgpu_charge_quiet(dev, op->need);
    if (rc != CUDA_SUCCESS && op->spare >= step_for(s) && trim_spare(s, op, pool, used, bytes))
        rc = vgpu_charge_quiet(dev, op->need); /* the pool's free steps made room */
    if (rc != CUDA_SUCCESS) {
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            vgpu_charge_refused(dev, bytes, "an allocation of");
        vgpu_budget_landed(dev, op->ahead);
        pthread_mutex_unlock(&s->grow);
        return rc;
    }
    return rc;
}

/* grow held: the allocation grew the pool beyond its shortfall (granularity, or a trim from
 * another thread between reading and calling) and the excess does not fit: free it, trim the pool
 * back to what is charged and refuse */
static CUresult undo(struct slot *s, CUmemoryPool pool, CUdeviceptr *dptr, CUstream st)
{
    uint64_t reserved;

    REAL(cuMemFreeAsync)(*dptr, st);
    REAL(cuStreamSynchronize)(st);
    REAL(cuMemPoolTrimTo)(pool, s->charged);
    *dptr = 0;
    if (attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0)
        settle_to(s, reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_HIDDEN CUresult vgpu_pool_end(struct vgpu_pool_op *op, CUresult rc, CUdeviceptr *dptr, uint64_t bytes,
                                   CUstream st)
{
    struct slot *s;
    uint64_t reserved;

    if (op->dev < 0)
        return rc;
    if (op->slot < 0) {
        vgpu_settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, VGPU_K_DPTR, op->dev, op->need);
        return rc;
    }
    s = at(op->slot);
    s->charged += op->need; /* the shortfall is the pool's now */
    if (attr(op->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) {
        if (rc != CUDA_SUCCESS) { /* unreadable now: a failed call took nothing */
            vgpu_budget_release(s->dev, op->need);
            s->charged -= op->need;
        }
    } else {
        if (rc == CUDA_SUCCESS && reserved > op->reserved)
            learn_step(s, reserved - op->reserved, op->shortfall);
        if (rc != CUDA_SUCCESS || reserved <= s->charged)
            settle_to(s, reserved);
        else if (vgpu_budget_reserve(s->dev, reserved - s->charged) == 0) /* grew by more than the step we knew */
            s->charged = reserved;
        else
            rc = undo(s, op->pool, dptr, st);
    }
    if (rc == CUDA_SUCCESS && vgpu_table_put(*dptr, VGPU_K_POOLED, op->slot, bytes) == 0) {
        s->out += bytes;
        __atomic_fetch_add(&pooled_live, 1, __ATOMIC_RELAXED);
    }
    vgpu_budget_landed(s->dev, op->need + op->ahead); /* the charge follows the reserve the driver reported */
    pthread_mutex_unlock(&s->grow);
    return rc;
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
    struct slot *s;
    uint64_t back;

    if (t.slot < 0)
        return;
    if (rc != CUDA_SUCCESS) {
        vgpu_table_put(p, VGPU_K_POOLED, t.slot, t.size); /* the driver kept it */
        return;
    }
    __atomic_fetch_sub(&pooled_live, 1, __ATOMIC_RELAXED);
    s = at(t.slot);
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
        struct slot *s = at(i);
        if (!s->pool || s->dead || s->dev != dev)
            continue;
        if (pthread_mutex_trylock(&s->grow) == 0) {
            if (attr(s->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0)
                back += settle_to(s, reserved);
            pthread_mutex_unlock(&s->grow);
        } else if (attr(s->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0 &&
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
    struct slot *s;

    if (!vgpu_table_get((uint64_t)(uintptr_t)pool, VGPU_K_POOLSLOT, &d, &cached))
        return; /* never allocated from through us */
    i = (int)cached;
    s = at(i);
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
        struct slot *s = at(i);
        memset(s, 0, sizeof *s);
        pthread_mutex_init(&s->grow, NULL);
    }
    pthread_mutex_init(&lock, NULL);
    pooled_live = 0;
}
