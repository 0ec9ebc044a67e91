"""The context-cost hint (c_src/region/hints.c): what a process's first CUDA context took, left in the region
for the container's next new process, which charges it before making its own (accounting/overhead.c).

It lives in the compute ledger's spare words, beside the limiter's, with a check word of its own: words any
process of the container (or a vendor one) may write are a hint only when the check holds, never larger than
the device, and the limiter's refills leave them alone."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from regiontools import LIMITER_SOURCES, REGION_SOURCES, build_program

PROGRAM = r"""
#include <stdio.h>
#include <string.h>

#include "limiter/bucket.h"
#include "limits/limits.h"
#include "region/region.h"

#define MiB (1ull << 20)

int main(void)
{
    vgpu_region_config_t cfg;
    vgpu_ledger_t *l;

    vgpu_limits_load_env();
    memset(&cfg, 0, sizeof cfg);
    cfg.device_count = 1;
    vgpu_region_config_from_env(&cfg);
    if (vgpu_region_attach(0, &cfg) != 0 || !(l = vgpu_region_ledger(0)))
        return 3;
    printf("fresh %llu\n", (unsigned long long)vgpu_region_ctx_hint(0, 0));
    vgpu_region_set_ctx_hint(0, 518 * MiB);
    printf("set %llu\n", (unsigned long long)(vgpu_region_ctx_hint(0, 0) / MiB));
    printf("bounded %llu\n", (unsigned long long)vgpu_region_ctx_hint(0, 512 * MiB)); /* a smaller device */
    printf("other_device %llu\n", (unsigned long long)vgpu_region_ctx_hint(1, 0));
    vgpu_bucket_refill(l, 0, 50, 1000000000ll, 100000000ll); /* the limiter takes the entry as its own */
    vgpu_bucket_charge(l, 5000000);
    printf("after_limiter %llu\n", (unsigned long long)(vgpu_region_ctx_hint(0, 0) / MiB));
    l->spare[3] = 1ull << 40; /* a writer that does not know the check word */
    printf("forged %llu\n", (unsigned long long)vgpu_region_ctx_hint(0, 0));
    vgpu_region_set_ctx_hint(0, 300 * MiB);
    memcpy(&vgpu_region_ledger(1)->spare[3], &l->spare[3], 16); /* a valid pair, copied to device 1 */
    printf("copied %llu\n", (unsigned long long)vgpu_region_ctx_hint(1, 0));
    return 0;
}
"""


@pytest.fixture(scope="module")
def hints_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bucket = [s for s in LIMITER_SOURCES if s.name == "bucket.c"]
    return build_program(tmp_path_factory.mktemp("hints"), "hints", PROGRAM, *REGION_SOURCES, *bucket)


def test_the_context_hint_is_checked_bounded_and_kept_apart_from_the_ledger(hints_exe: Path,
                                                                           region_env: dict) -> None:
    p = subprocess.run([str(hints_exe)], env=region_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    r = dict(line.split() for line in p.stdout.splitlines())
    assert r["fresh"] == "0", r          # nothing written yet: no hint
    assert r["set"] == "518", r
    assert r["bounded"] == "0", r        # larger than the device: not believed
    assert r["other_device"] == "0", r   # per device
    assert r["after_limiter"] == "518", r
    assert r["forged"] == "0", r         # bytes without their check word
    assert r["copied"] == "0", r         # the check covers the device too
