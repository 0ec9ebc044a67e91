/* The container's SM budget for one device (bucket.c): a token bucket of GPU nanoseconds kept in
 * the shared region's ledger, so every process of the container draws from one budget. */
#ifndef VGPU_LIMITER_BUCKET_H
#define VGPU_LIMITER_BUCKET_H

#include "region/layout.h"
#include "vgpu.h"

/* the region's ledger entry for dev, or this process's own when no region is attached */
VGPU_HIDDEN vgpu_ledger_t *vgpu_bucket_of(int dev);
/* top the bucket up for the wall time since anyone last did, at pct% (capped at burst_ns);
 * returns the tokens now (negative: the container is in debt) */
VGPU_HIDDEN long long vgpu_bucket_refill(vgpu_ledger_t *b, int dev, int pct, long long now, long long burst_ns);
/* take ns of GPU time; ns < 0 gives back part of a charge taken ahead (a measured launch is charged its
 * estimate when it is made, and settled once measured) */
VGPU_HIDDEN void vgpu_bucket_charge(vgpu_ledger_t *b, long long ns);
VGPU_HIDDEN long long vgpu_bucket_tokens(const vgpu_ledger_t *b);
/* when any process of the container last refilled the bucket (CLOCK_MONOTONIC ns; garbage from a foreign
 * writer possible): every process that launches refills it at least every few ms */
VGPU_HIDDEN long long vgpu_bucket_refilled_at(const vgpu_ledger_t *b);

#endif
