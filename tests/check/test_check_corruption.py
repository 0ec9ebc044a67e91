"""Random byte damage (seeded) never escapes as a traceback: a Report or one ElfError line."""
from __future__ import annotations

import random
from pathlib import Path

from vgpu_patch.elf.check import Report, check_file
from vgpu_patch.report.errors import ElfError

HEADERS = 0x40 + 56 * 10  # ELF header and the first program headers, where damage hurts most


def test_damaged_copies_give_a_report_or_one_line_error(built: dict[str, Path], tmp_path: Path) -> None:
    src = built["glibc-2.34"].read_bytes()
    rng = random.Random(20261201)
    path = tmp_path / "damaged.so"
    outcomes = {"report": 0, "error": 0}
    for _ in range(120):
        data = bytearray(src)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(HEADERS) if rng.random() < 0.5 else rng.randrange(len(data))
            data[pos] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            assert isinstance(check_file(path), Report)
            outcomes["report"] += 1
        except ElfError as e:
            assert "\n" not in str(e) and str(path) in str(e)
            outcomes["error"] += 1
    assert outcomes["report"] and outcomes["error"]  # both paths were exercised
