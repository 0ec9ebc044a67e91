"""SM limits as real shares of a real GPU (run on the H200: `pytest tests/gpu --gpu -s`): one budget
per container, fair between containers (tests/region/test_sm_share.py proves the same over a
simulated GPU in CI; bench/sm_share.py prints the whole table beside MPS)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Gpu
from .shares import LONG_ITERS, SHORT_ITERS, Container, ShareRunner, jain

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def runner(gpu: Gpu, region_gpu: Path) -> ShareRunner:
    return ShareRunner(region_gpu, gpu.shim, gpu.tmp / "shares")


@pytest.mark.parametrize("iters", [LONG_ITERS, SHORT_ITERS], ids=["long", "short"])
def test_one_budget_per_container(runner: ShareRunner, iters: int) -> None:
    [two] = runner.run([Container(50, 2)], iters)
    [three] = runner.run([Container(30, 3)], iters)
    print(f"\nFIGURE one container, iters {iters}: 2 processes at 50 -> {two:.3f}, 3 at 30 -> {three:.3f}")
    # the target, within 0.03 of the limit: 0.493-0.509 and 0.288-0.303 on the H200 with the board's
    # busy history (docs/benchmarks.md#sm-shares); without it 2 x 50 gave 0.39-0.48 and 3 x 30 0.25-0.29, and
    # an older board marking gave 3 x 30 up to 0.376
    assert abs(two - 0.50) <= 0.03 and abs(three - 0.30) <= 0.03


@pytest.mark.parametrize("iters", [LONG_ITERS, SHORT_ITERS], ids=["long", "short"])
def test_containers_share_fairly(runner: ShareRunner, iters: int) -> None:
    half = runner.run([Container(50), Container(50)], iters)
    quarter = runner.run([Container(25), Container(25)], iters)
    beside = runner.run([Container(50), Container(None)], iters)
    print(f"\nFIGURE containers, iters {iters}: 50/50 -> {half}, 25/25 -> {quarter}, 50 beside none -> {beside}")
    ceiling = runner.run([Container(None), Container(None)], iters, shim=False)  # what time-slicing gives
    assert min(half) >= min(0.42, 0.9 * min(ceiling)) and jain(half) >= 0.98
    # 0.247-0.258 with the board's busy history; 0.217-0.312 without it
    assert all(0.23 <= q <= 0.27 for q in quarter) and jain(quarter) >= 0.98
    assert beside[0] >= min(0.42, 0.9 * min(ceiling))
