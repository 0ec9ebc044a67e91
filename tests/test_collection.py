"""The suite runs every test it has: each tests/**/test_*.py is collected (pytest skips a folder named
`build` by default, and a folder it does not enter fails no run, so this test is the alarm)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_file_is_collected() -> None:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    seen = {line.split("::", 1)[0] for line in p.stdout.splitlines() if "::" in line}
    # a module that skips itself as a whole (no compiler, no sshd) was still found
    seen |= set(re.findall(r"^SKIPPED \[\d+\] (tests/\S+?\.py)", p.stdout, re.MULTILINE))
    files = {f.relative_to(ROOT).as_posix() for f in (ROOT / "tests").rglob("test_*.py")}
    missing = sorted(files - seen)
    assert not missing, f"test files pytest does not collect (check norecursedirs in pyproject.toml): {missing}"
