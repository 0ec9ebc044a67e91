"""Fixtures for `vgpu-patch build` tests: the fixture tree (buildtree.py) and cached real builds.

zig builds its libc once per target; one cache per test session keeps that to a few seconds each.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
from buildtree import FILES, write_tree

from vgpu_patch.shim_build.build import BuildResult, build_shim


@pytest.fixture(scope="session", autouse=True)
def zig_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One zig cache per session (or the developer's VGPU_PATCH_ZIG_CACHE, to rerun fast)."""
    if os.environ.get("VGPU_PATCH_ZIG_CACHE"):
        return Path(os.environ["VGPU_PATCH_ZIG_CACHE"])
    d = tmp_path_factory.mktemp("zig-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("VGPU_PATCH_ZIG_CACHE", str(d))
    yield d
    mp.undo()


@pytest.fixture(scope="session")
def fixture_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("src") / "c_src")


@pytest.fixture
def make_src(tmp_path: Path) -> Callable[..., Path]:
    """A fresh copy of the fixture tree with some files replaced, for error cases."""

    def make(name: str = "c_src", **overrides: str) -> Path:
        files = dict(FILES)
        files.update(overrides)  # relative path -> new text
        return write_tree(tmp_path / name, files)

    return make


@pytest.fixture(scope="session")
def built(fixture_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., BuildResult]:
    """build(arch, glibc, compiler, profile) of the fixture tree, each variant built once a session."""
    cache: dict[tuple, BuildResult] = {}

    def get(arch: str | None = "x86_64", glibc: str | None = "2.28", compiler: str | None = None,
            profile: str = "release") -> BuildResult:
        key = (arch, glibc, compiler, profile)
        if key not in cache:
            out = tmp_path_factory.mktemp("out")
            cache[key] = build_shim(out, arch=arch, glibc=glibc, compiler=compiler, profile=profile,
                                    src_dir=fixture_src)
        return cache[key]

    return get
