/* Sharded chained hash table. Each shard grows by doubling (amortised O(1)) and keeps a free
 * list so steady alloc/free traffic does not hit malloc. */
#include <pthread.h>
#include <stdlib.h>

#include "accounting/table.h"

#define SHARD_BITS 6
#define NSHARDS (1u << SHARD_BITS)
#define INITIAL_BUCKETS 64u

struct entry {
    struct entry *next;
    uint64_t key;
    uint64_t size;
    int32_t dev;
    int32_t kind;
};

struct shard {
    pthread_mutex_t lock;
    struct entry **buckets;
    size_t nbuckets; /* power of two, 0 until first use */
    size_t count;
    struct entry *free_list;
} __attribute__((aligned(64))); /* one cache line per lock: no false sharing between shards */

static struct shard shards[NSHARDS] = {[0 ... NSHARDS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static uint64_t mix(uint64_t key, int kind)
{
    uint64_t x = key ^ ((uint64_t)kind << 56);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static int grow(struct shard *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : INITIAL_BUCKETS;
    struct entry **b = calloc(n, sizeof *b);
    size_t i;

    if (!b)
        return -1;
    for (i = 0; i < s->nbuckets; i++) {
        struct entry *e = s->buckets[i], *next;
        for (; e; e = next) {
            size_t j = (size_t)(mix(e->key, e->kind) >> SHARD_BITS) & (n - 1);
            next = e->next;
            e->next = b[j];
            b[j] = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return 0;
}

static struct entry **find(struct shard *s, uint64_t h, uint64_t key, int kind)
{
    struct entry **pp;

    if (!s->nbuckets)
        return NULL;
    for (pp = &s->buckets[(size_t)(h >> SHARD_BITS) & (s->nbuckets - 1)]; *pp; pp = &(*pp)->next)
        if ((*pp)->key == key && (*pp)->kind == kind)
            return pp;
    return NULL;
}

VGPU_HIDDEN int vgpu_table_put(uint64_t key, int kind, int dev, uint64_t size)
{
    uint64_t h = mix(key, kind);
    struct shard *s = &shards[h & (NSHARDS - 1)];
    struct entry **pp, *e;
    int rc = 0;

    pthread_mutex_lock(&s->lock);
    pp = find(s, h, key, kind);
    if (pp) {
        (*pp)->dev = dev;
        (*pp)->size = size;
        goto out;
    }
    if ((s->count + 1) * 4 > s->nbuckets * 3 && grow(s) != 0 && !s->nbuckets) {
        rc = -1;
        goto out;
    }
    e = s->free_list;
    if (e)
        s->free_list = e->next;
    else if (!(e = malloc(sizeof *e))) {
        rc = -1;
        goto out;
    }
    e->key = key;
    e->kind = kind;
    e->dev = dev;
    e->size = size;
    pp = &s->buckets[(size_t)(h >> SHARD_BITS) & (s->nbuckets - 1)];
    e->next = *pp;
    *pp = e;
    s->count++;
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int lookup(uint64_t key, int kind, int *dev, uint64_t *size, int remove)
{
    uint64_t h = mix(key, kind);
    struct shard *s = &shards[h & (NSHARDS - 1)];
    struct entry **pp, *e;
    int found = 0;

    pthread_mutex_lock(&s->lock);
    pp = find(s, h, key, kind);
    if (pp) {
        e = *pp;
        *dev = e->dev;
        *size = e->size;
        found = 1;
        if (remove) {
            *pp = e->next;
            e->next = s->free_list;
            s->free_list = e;
            s->count--;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}

VGPU_HIDDEN int vgpu_table_take(uint64_t key, int kind, int *dev, uint64_t *size)
{
    return lookup(key, kind, dev, size, 1);
}

VGPU_HIDDEN int vgpu_table_get(uint64_t key, int kind, int *dev, uint64_t *size)
{
    return lookup(key, kind, dev, size, 0);
}

VGPU_HIDDEN size_t vgpu_table_count(void)
{
    size_t n = 0;
    unsigned i;

    for (i = 0; i < NSHARDS; i++) {
        pthread_mutex_lock(&shards[i].lock);
        n += shards[i].count;
        pthread_mutex_unlock(&shards[i].lock);
    }
    return n;
}

VGPU_HIDDEN void vgpu_table_atfork_prepare(void)
{
    unsigned i;

    for (i = 0; i < NSHARDS; i++)
        pthread_mutex_lock(&shards[i].lock);
}

VGPU_HIDDEN void vgpu_table_atfork_parent(void)
{
    unsigned i;

    for (i = NSHARDS; i-- > 0;)
        pthread_mutex_unlock(&shards[i].lock);
}

/* the child is single-threaded: re-create the locks instead of unlocking the parent's */
VGPU_HIDDEN void vgpu_table_atfork_child(void)
{
    unsigned i;

    for (i = 0; i < NSHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
}
