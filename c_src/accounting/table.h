/* O(1) map from an allocation's key (device pointer, VMM handle, array, pool) to (dev, size).
 * 64 shards, each with its own lock held only for the table operation, never across a driver call. */
#ifndef VGPU_TABLE_H
#define VGPU_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "vgpu.h"

enum vgpu_kind {
    VGPU_K_DPTR = 1,   /* cuMemAlloc*, pitch, stream-ordered: key = CUdeviceptr */
    VGPU_K_VMM = 2,    /* cuMemCreate: key = CUmemGenericAllocationHandle */
    VGPU_K_ARRAY = 3,  /* cuArrayCreate / cuArray3DCreate: key = CUarray */
    VGPU_K_MIPMAP = 4, /* cuMipmappedArrayCreate: key = CUmipmappedArray */
    VGPU_K_POOL = 5,   /* memory pool -> its device (size unused): key = CUmemoryPool */
    VGPU_K_POOLED = 6, /* allocation from a charged pool -> (pool slot, size): key = CUdeviceptr */
    VGPU_K_POOLSLOT = 7, /* memory pool -> (device, pool slot): key = CUmemoryPool (accounting/pool.c) */
    VGPU_K_MANAGED = 8, /* cuMemAllocManaged: key = CUdeviceptr (freed as a VGPU_K_DPTR) */
};

/* 0 on success, -1 when out of memory; an existing (key, kind) is overwritten */
VGPU_HIDDEN int vgpu_table_put(uint64_t key, int kind, int dev, uint64_t size);
/* 1 and the entry removed when found, else 0 */
VGPU_HIDDEN int vgpu_table_take(uint64_t key, int kind, int *dev, uint64_t *size);
/* 1 when found (entry kept), else 0 */
VGPU_HIDDEN int vgpu_table_get(uint64_t key, int kind, int *dev, uint64_t *size);
VGPU_HIDDEN size_t vgpu_table_count(void);
/* fork: hold every shard across fork() so the child never sees a half-updated chain */
VGPU_HIDDEN void vgpu_table_atfork_prepare(void);
VGPU_HIDDEN void vgpu_table_atfork_parent(void);
VGPU_HIDDEN void vgpu_table_atfork_child(void);

#endif
