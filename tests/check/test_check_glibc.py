"""The glibc floor read from a target's libc.so.6, a file or an unpacked image."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from elfcheck_fixtures import cli_runner

from vgpu_patch.commands.check import cli
from vgpu_patch.elf.check import glibc_floor_of_libc
from vgpu_patch.elf.glibc import parse_floor
from vgpu_patch.report.errors import ElfError, UsageError


def host_libc() -> Path:
    for d in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"):
        p = Path(d) / "libc.so.6"
        if p.exists():
            return p.resolve()
    pytest.skip("no glibc libc.so.6 on this host")


def host_release() -> str:
    name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if not name.startswith("glibc "):
        pytest.skip("host libc is not glibc")
    return name.split()[1]


def test_floor_of_host_libc() -> None:
    assert glibc_floor_of_libc(host_libc()) == host_release()


def test_floor_of_an_unpacked_image_with_absolute_symlink(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    real = root / "usr/lib/real/libc-2.x.so"
    real.parent.mkdir(parents=True)
    shutil.copy(host_libc(), real)
    (root / "lib64").mkdir()
    # absolute inside the image, as RHEL-style images have: must resolve under root, not on this host
    (root / "lib64/libc.so.6").symlink_to("/usr/lib/real/libc-2.x.so")
    assert glibc_floor_of_libc(root) == host_release()


def test_image_without_libc(tmp_path: Path) -> None:
    with pytest.raises(ElfError, match=r"no libc.so.6 under"):
        glibc_floor_of_libc(tmp_path)


def test_not_glibc(built: dict[str, Path]) -> None:
    with pytest.raises(ElfError, match=r"defines no GLIBC_x.y"):
        glibc_floor_of_libc(built["good"])


def test_cli_glibc_from(built: dict[str, Path]) -> None:
    # the 2.34 build passes against this host's newer libc, and says where the floor came from
    result = cli_runner().invoke(cli, [str(built["glibc-2.34"]), "--glibc-from", str(host_libc()), "--json"])
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["glibc_floor"] == host_release() and doc["glibc_floor_source"] == str(host_libc())
    assert "read from" in result.stderr


def test_cli_glibc_from_image_missing_libc(built: dict[str, Path], tmp_path: Path) -> None:
    result = cli_runner().invoke(cli, [str(built["good"]), "--glibc-from-image", str(tmp_path)])
    assert result.exit_code == 1 and "no libc.so.6 under" in result.stderr


@pytest.mark.parametrize("text,want", [("2.28", "2.28"), ("GLIBC_2.17", "2.17"), ("none", None), (None, None),
                                       ("2.2.5", "2.2.5")])
def test_parse_floor(text: str | None, want: str | None) -> None:
    assert parse_floor(text) == want


@pytest.mark.parametrize("text", ["2", "two", "2.x", ""])
def test_parse_floor_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_floor(text)
