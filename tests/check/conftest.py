"""Session-wide gcc-built fixtures for the `check` tests (built once, ~2 s)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import elfcheck_fixtures as libs


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not libs.have_gcc():
        pytest.skip("gcc is needed to build the ELF fixtures")
    return libs.build_all(tmp_path_factory.mktemp("elfcheck"))


@pytest.fixture(scope="session")
def aarch64_lib(built: dict[str, Path]) -> Path:
    if not libs.zig_available():
        pytest.skip("ziglang is needed to cross-build an aarch64 fixture")
    return libs.zig_build(built["good"].parent, "aarch64", "aarch64-linux-gnu.2.28")


@pytest.fixture(scope="session")
def i386_lib(built: dict[str, Path]) -> Path:
    if not libs.zig_available():
        pytest.skip("ziglang is needed to cross-build a 32-bit fixture")
    d = built["good"].parent
    (d / "tiny.c").write_text("int cuInit(void) { return 0; }\n")
    return libs.zig_build(d, "i386", "x86-linux-gnu", source="tiny.c")

