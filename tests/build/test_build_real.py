"""The real c_src builds, for the default target and aarch64, and exports exactly hooks.def."""
from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_patch import elfproof
from vgpu_patch.build import SRC_DIR, build_shim
from vgpu_patch.surface import exported_names

HOOKS = SRC_DIR / "interpose" / "hooks.def"
pytestmark = pytest.mark.skipif(not HOOKS.is_file(), reason="c_src/interpose/hooks.def not written yet")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_real_c_src_builds_for_the_default_floor(tmp_path: Path, arch: str) -> None:
    r = build_shim(tmp_path / "out", arch=arch)
    facts = elfproof.read_facts(r.library)
    assert facts.exports == exported_names(HOOKS)
    assert r.manifest["glibc_floor"] == "2.28"
    assert tuple(int(x) for x in r.manifest["glibc_max_required"].split(".")) <= (2, 28)
    assert b"vgpu-patch-shim " in r.library.read_bytes()  # deploy tools recognise our build by it
