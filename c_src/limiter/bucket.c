/* === BUCKET: one SM budget per container and device.
 *
 * A token bucket of GPU nanoseconds in the region's ledger (region/layout.h): it fills at pct% of
 * wall time up to a burst, and every process of the container charges its kernels' GPU time to it,
 * lock-free (an atomic subtract; whoever refills first wins a CAS on the refill time). A process
 * that exits or is killed holds nothing: what it charged was GPU time really used, and the bucket
 * refills by the clock alone. Without a region each process has its own bucket (per-process
 * limits, as before).
 *
 * The words are in a file others may write (the vendor's processes, a broken one): an entry
 * without our check word is started afresh, a refill time out of range restarts the clock, and the
 * tokens are kept within [-MAX_DEBT_NS, burst], so garbage never makes a process sleep for long
 * nor run unthrottled for long. */
#include "limiter/bucket.h"
#include "region/region.h"

#define MAX_DEBT_NS 1000000000ll /* at most 1 s of GPU time owed */
#define MIN_REFILL_NS 100000ll   /* refills closer together than 0.1 ms are skipped */

static vgpu_ledger_t local[VGPU_MAX_DEVICES];

VGPU_HIDDEN vgpu_ledger_t *vgpu_bucket_of(int dev)
{
    vgpu_ledger_t *b = vgpu_region_ledger(dev);
    return b ? b : &local[dev];
}

static long long load(const uint64_t *w)
{
    return (long long)__atomic_load_n(w, __ATOMIC_RELAXED);
}

VGPU_HIDDEN long long vgpu_bucket_tokens(const vgpu_ledger_t *b)
{
    return load(&b->tokens);
}

VGPU_HIDDEN long long vgpu_bucket_refilled_at(const vgpu_ledger_t *b)
{
    return (long long)__atomic_load_n(&b->refill_ns, __ATOMIC_ACQUIRE);
}

VGPU_HIDDEN void vgpu_bucket_charge(vgpu_ledger_t *b, long long ns)
{
    if (ns) /* two's complement: subtracting a negative adds; the next refill clamps */
        __atomic_fetch_sub(&b->tokens, (uint64_t)ns, __ATOMIC_RELAXED);
}

static void clamp(vgpu_ledger_t *b, long long burst_ns)
{
    long long cur = load(&b->tokens), want;

    for (;;) {
        want = cur > burst_ns ? burst_ns : cur < -MAX_DEBT_NS ? -MAX_DEBT_NS : cur;
        if (want == cur || __atomic_compare_exchange_n(&b->tokens, (uint64_t *)&cur, (uint64_t)want, 1,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return;
    }
}

VGPU_HIDDEN long long vgpu_bucket_refill(vgpu_ledger_t *b, int dev, int pct, long long now, long long burst_ns)
{
    uint64_t check = VGPU_LEDGER_CHECK ^ (uint64_t)dev, seen = __atomic_load_n(&b->check, __ATOMIC_ACQUIRE);
    long long last, gap;

    if (seen != check) {
        /* first use, or not ours: start full, from now (one process wins; the others see it done) */
        if (__atomic_compare_exchange_n(&b->check, &seen, check, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&b->tokens, (uint64_t)burst_ns, __ATOMIC_RELAXED);
            __atomic_store_n(&b->refill_ns, (uint64_t)now, __ATOMIC_RELEASE);
        }
        return load(&b->tokens);
    }
    last = (long long)__atomic_load_n(&b->refill_ns, __ATOMIC_ACQUIRE);
    gap = now - last;
    if (gap < MIN_REFILL_NS && gap >= -1000000000ll)
        return load(&b->tokens);
    if (__atomic_compare_exchange_n(&b->refill_ns, (uint64_t *)&last, (uint64_t)now, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
        /* a refill time in the future (garbage, another clock) restarts the clock with nothing added;
         * a gap longer than it takes to fill the bucket adds no more than a full bucket */
        if (gap > 0) {
            long long fill = gap > 100ll * MAX_DEBT_NS ? 100ll * MAX_DEBT_NS : gap;
            __atomic_fetch_add(&b->tokens, (uint64_t)(fill * pct / 100), __ATOMIC_RELAXED);
        }
        clamp(b, burst_ns);
    }
    return load(&b->tokens);
}
