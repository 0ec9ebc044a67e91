/* Hints the container's processes leave each other, in words nobody else reads: the device memory
 * a process's first CUDA context took when it was created. A process about to create its own can
 * then tell whether one would fit before the driver takes the memory (accounting/overhead.c).
 *
 * Where: the spare words of the compute ledger's entries (layout.h), spare[3] the bytes and
 * spare[4] a check word over them and the device. A hint without its check (never written, a torn
 * write, a vendor process that took the slot as its 1024th) is no hint; nor is one larger than the
 * device. A hint is only ever a guess about the next context: the one created is measured. */
#include "region/region.h"

#define HINT_CHECK 0x767067756374786eull /* "vgpuctxn" */

static uint64_t check_of(int dev, uint64_t bytes)
{
    return (bytes * 0x9e3779b97f4a7c15ull) ^ HINT_CHECK ^ (uint64_t)dev;
}

VGPU_HIDDEN uint64_t vgpu_region_ctx_hint(int dev, uint64_t device_bytes)
{
    vgpu_ledger_t *l = vgpu_region_ledger(dev);
    uint64_t bytes, check;

    if (!l)
        return 0;
    bytes = __atomic_load_n(&l->spare[3], __ATOMIC_ACQUIRE);
    check = __atomic_load_n(&l->spare[4], __ATOMIC_ACQUIRE);
    return bytes && check == check_of(dev, bytes) && (!device_bytes || bytes <= device_bytes) ? bytes : 0;
}

VGPU_HIDDEN void vgpu_region_set_ctx_hint(int dev, uint64_t bytes)
{
    vgpu_ledger_t *l = vgpu_region_ledger(dev);

    if (!l || !bytes)
        return;
    /* racing writers may leave one's bytes with the other's check: no hint, which is safe */
    __atomic_store_n(&l->spare[4], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&l->spare[3], bytes, __ATOMIC_RELEASE);
    __atomic_store_n(&l->spare[4], check_of(dev, bytes), __ATOMIC_RELEASE);
}
