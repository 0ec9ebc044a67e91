"""The real c_src builds, for the default target and aarch64, and exports exactly hooks.def."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vgpu_patch import elfproof
from vgpu_patch.build import SRC_DIR, build_shim
from vgpu_patch.sources import find_hooks_def
from vgpu_patch.surface import exported_names

HOOKS = find_hooks_def(SRC_DIR)
pytestmark = pytest.mark.skipif(not HOOKS.is_file(), reason="c_src has no hooks.def yet")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_real_c_src_builds_for_the_default_floor(tmp_path: Path, arch: str) -> None:
    r = build_shim(tmp_path / "out", arch=arch)
    facts = elfproof.read_facts(r.library)
    assert facts.exports == exported_names(HOOKS)
    assert r.manifest["glibc_floor"] == "2.28"
    assert tuple(int(x) for x in r.manifest["glibc_max_required"].split(".")) <= (2, 28)
    assert b"vgpu-patch-shim " in r.library.read_bytes()  # deploy tools recognise our build by it


def test_real_c_src_is_reproducible_from_another_path(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "c_src"
    shutil.copytree(SRC_DIR, copy, ignore=shutil.ignore_patterns("tests", ".*"))
    a = build_shim(tmp_path / "a", arch="x86_64")
    b = build_shim(tmp_path / "b", arch="x86_64", src_dir=copy)
    if a.manifest["source_sha256"] != b.manifest["source_sha256"]:
        pytest.skip("c_src changed between the two builds (being edited)")
    assert a.sha256 == b.sha256
    assert str(SRC_DIR).encode() not in a.library.read_bytes()
