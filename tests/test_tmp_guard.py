"""A run leaves nothing in /tmp: its temporary files live under one directory of its own (pytest's basetemp and
$TMPDIR), removed at the end, and tests/tmp_guard.py names what appears anywhere else."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tmp_guard

ROOT = Path(__file__).resolve().parent.parent


def test_tmp_path_and_tmpdir_live_under_the_runs_own_directory(tmp_path: Path) -> None:
    tmpdir = Path(os.environ["TMPDIR"])
    assert tmpdir.name == "tmp" and tmpdir.parent.name.startswith("vgpu-t-"), tmpdir
    assert Path(tempfile.gettempdir()) == tmpdir
    assert tmp_path.is_relative_to(tmpdir.parent / "bt"), tmp_path


def test_left_behind_names_new_files_and_a_touched_default_region(tmp_path: Path) -> None:
    before = tmp_guard.snapshot(tmp_path)
    assert tmp_guard.left_behind(before, tmp_path) == []
    (tmp_path / "pytest-of-root").mkdir()
    (tmp_path / "cudevshr.cache").write_bytes(b"x")
    assert tmp_guard.left_behind(before, tmp_path) == [f"{tmp_path}/cudevshr.cache", f"{tmp_path}/pytest-of-root"]
    before = tmp_guard.snapshot(tmp_path)
    os.utime(tmp_path / "cudevshr.cache", ns=(1, 1))
    assert tmp_guard.left_behind(before, tmp_path) == [f"{tmp_path}/cudevshr.cache (modified)"]


def test_a_run_removes_its_directory_and_fails_when_a_test_leaves_a_file(tmp_path: Path) -> None:
    """A nested run of the suite's own conftest: its run directory goes, and a file a test drops in the
    checked directory fails it by name (the check's root is /tmp; here the leak goes there too, and is
    removed afterwards)."""
    leak = Path("/tmp") / f"vgpu-leak-{os.getpid()}-{os.urandom(4).hex()}"
    (tmp_path / "test_leaks.py").write_text(
        "import tempfile\n"
        "from pathlib import Path\n"
        "def test_leak(tmp_path):\n"
        "    Path(tempfile.gettempdir(), 'inside').write_text('fine: the run removes it')\n"
        "    print('RUN_DIR=' + str(Path(tempfile.gettempdir()).parent))\n"
        f"    Path({str(leak)!r}).write_text('x')\n")
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {**os.environ, "VGPU_TEST_TMP_CHECK": "1", "PYTHONPATH": str(ROOT / "tests")}
    env.pop("TMPDIR")  # as a run started from a shell
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                            "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_leaks.py")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        leak.unlink(missing_ok=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "1 passed" in p.stdout and "the tests left " in p.stdout and f"{leak}" in p.stdout, p.stdout
    run_dir = Path(p.stdout.split("RUN_DIR=", 1)[1].split()[0])
    assert run_dir.name.startswith("vgpu-t-") and not run_dir.exists(), run_dir
