"""The real c_src builds, for the default target and aarch64, exports exactly hooks.def, and gives the same
bytes from another directory, another fresh zig cache, another temp dir and epoch, and an installed wheel."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_patch.elf import proof
from vgpu_patch.shim_build.build import SRC_DIR, build_shim
from vgpu_patch.shim_build.sources import find_hooks_def
from vgpu_patch.shim_build.surface import exported_names

ROOT = Path(__file__).resolve().parents[2]
HOOKS = find_hooks_def(SRC_DIR)
pytestmark = pytest.mark.skipif(not HOOKS.is_file(), reason="c_src has no hooks.def yet")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_real_c_src_builds_for_the_default_floor(tmp_path: Path, arch: str) -> None:
    r = build_shim(tmp_path / "out", arch=arch)
    facts = proof.read_facts(r.library)
    assert facts.exports == exported_names(HOOKS)
    assert r.manifest["glibc_floor"] == "2.28"
    assert tuple(int(x) for x in r.manifest["glibc_max_required"].split(".")) <= (2, 28)
    assert b"vgpu-patch-shim " in r.library.read_bytes()  # deploy tools recognise our build by it


def _link_tree(src: Path, dest: Path) -> None:
    """A hard-linked copy (the zig wheel is ~400 MB); a plain copy where links cannot cross filesystems."""
    try:
        shutil.copytree(src, dest, copy_function=os.link, symlinks=True)
    except (OSError, shutil.Error):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, symlinks=True)


def _relocate(dist_name: str, site: Path) -> None:
    """Install an already installed distribution (its files and dist-info) again under `site`."""
    dist = importlib.metadata.distribution(dist_name)
    base = Path(str(dist.locate_file("")))
    tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    for top in sorted(tops):
        if (base / top).is_dir() and not (site / top).exists():
            _link_tree(base / top, site / top)


def _install_wheel(tmp_path: Path) -> Path:
    """`pip wheel` of a copy of the checkout, `pip install --target` of that wheel, with zig and the header
    wheels relocated beside it: every path the build could leak differs from the checkout's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "c_src", repo / "c_src")
    shutil.copytree(ROOT / "vgpu_patch", repo / "vgpu_patch", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(repo)],
                   check=True, capture_output=True, timeout=300)
    site = tmp_path / "site"
    wheel = next((tmp_path / "dist").glob("vgpu_patch-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    for dist in ("ziglang", "nvidia-cuda-runtime", "nvidia-nvml-dev"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # headers from a toolkit: none
            _relocate(dist, site)
    return site


def test_real_c_src_is_byte_identical_from_another_dir_cache_and_install(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "elsewhere" / "deeper" / "c_src"
    shutil.copytree(SRC_DIR, copy, ignore=shutil.ignore_patterns("tests", ".*"))
    monkeypatch.setenv("VGPU_PATCH_ZIG_CACHE", str(tmp_path / "zig-cache-a"))
    a = build_shim(tmp_path / "a", arch="x86_64", compiler="zig", src_dir=copy)

    site = _install_wheel(tmp_path)
    (tmp_path / "tmp-b").mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "VGPU_PATCH_ZIG_CACHE": str(tmp_path / "zig-cache-b"),
           "TMPDIR": str(tmp_path / "tmp-b"), "SOURCE_DATE_EPOCH": "1700000000"}
    p = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "build", "-o", str(tmp_path / "b"), "--no-check",
                        "--arch", "x86_64", "--compiler", "zig"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    b_lib = tmp_path / "b" / "libvgpu.so"
    m_b = (tmp_path / "b" / "libvgpu.so.json").read_text()
    if a.manifest["source_sha256"] not in m_b:
        pytest.skip("c_src changed between the two builds (being edited)")
    assert a.library.read_bytes() == b_lib.read_bytes()
    assert a.manifest_path.read_text() == m_b  # the manifest too: no paths, no times
    for leak in (str(tmp_path), "site-packages", "vgpu-build-", ".debug_"):  # no paths, no DWARF sections
        assert leak.encode() not in b_lib.read_bytes(), leak
