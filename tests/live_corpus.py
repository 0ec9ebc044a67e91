"""Node directories for the live-file rule (docs/node-state.md "The live file"), shared by the CLI, the Ansible
role and the agent tests: each tool must swap the same file, or refuse with the same reason.

A case lays out `<root>/usr/local/vgpu`: every file a copy of the vendor's library ("link:NAME" makes a
symlink), an optional ld.so.preload, and `mapped`: the file a running process maps (the test holds the map).
`live` is the name a deploy must replace; `refuse` instead is a phrase the refusal must contain.
"""
from __future__ import annotations

import mmap
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HAMI_PRELOAD = "/usr/local/vgpu/libvgpu.so\n"  # what HAMi's vgpu-init.sh writes: the container-side path

# Names operators and tools leave beside the live file: never live.
LEFTOVERS = [".bak", ".orig", ".old", ".new", ".backup-original", ".backup-20261201", ".patched", ".dpkg-old",
             ".dpkg-dist", ".dpkg-new", ".rpmsave", ".rpmnew", ".swp", ".vgpu-patch-tmp.4242", ".save", ".1.bak",
             ".v2.6.0.bak", ".2.6.0~", ".copy", ".v2.6.0-old"]


@dataclass(frozen=True)
class Case:
    id: str
    files: tuple[str, ...]
    live: str | None = None
    refuse: str | None = None
    preload: str | None = None
    mapped: str | None = None
    links: dict[str, str] = field(default_factory=dict)  # name -> what it points at

    def __hash__(self) -> int:
        return hash(self.id)


CASES = [
    # the operator: a hand-made backup beside the vendor's file, with and without HAMi's preload
    Case("hand-backup", ("libvgpu.so", "libvgpu.so.backup-original"), live="libvgpu.so"),
    Case("hand-backup-preload", ("libvgpu.so", "libvgpu.so.backup-original"), live="libvgpu.so",
         preload=HAMI_PRELOAD),
    Case("bak-and-orig", ("libvgpu.so", "libvgpu.so.bak", "libvgpu.so.orig"), live="libvgpu.so"),
    Case("every-leftover", ("libvgpu.so", *(f"libvgpu.so{s}" for s in LEFTOVERS)), live="libvgpu.so",
         preload=HAMI_PRELOAD),
    Case("versioned-and-its-backup", ("libvgpu.so.v2.6.0", "libvgpu.so.v2.6.0.bak"), live="libvgpu.so.v2.6.0"),
    Case("versioned-beside-plain", ("libvgpu.so", "libvgpu.so.v2.6.0", "libvgpu.so.v2.6.0.orig"),
         live="libvgpu.so.v2.6.0", preload=HAMI_PRELOAD),
    Case("version-no-v", ("libvgpu.so", "libvgpu.so.2.6.0", "libvgpu.so.2.6.0.dpkg-old"), live="libvgpu.so.2.6.0"),
    Case("version-rc", ("libvgpu.so.v2.6.0-rc1", "libvgpu.so.backup-original"), live="libvgpu.so.v2.6.0-rc1"),
    Case("two-versions", ("libvgpu.so.v2.5.0", "libvgpu.so.v2.6.0"), refuse="several versioned libraries"),
    Case("two-versions-preload", ("libvgpu.so.v2.5.0", "libvgpu.so.v2.6.0"), live="libvgpu.so.v2.6.0",
         preload="# HAMi\n/usr/local/vgpu/libvgpu.so.v2.6.0\n"),
    Case("two-versions-mapped", ("libvgpu.so.v2.5.0", "libvgpu.so.v2.6.0", "libvgpu.so.v2.5.0.bak"),
         live="libvgpu.so.v2.5.0", mapped="libvgpu.so.v2.5.0"),
    Case("preload-names-a-leftover", ("libvgpu.so", "libvgpu.so.bak"), refuse="ld.so.preload names",
         preload="/usr/local/vgpu/libvgpu.so.bak\n"),
    Case("leftover-symlink", ("libvgpu.so",), live="libvgpu.so", links={"libvgpu.so.bak": "libvgpu.so"}),
    Case("versioned-symlink", ("libvgpu.so.real",), refuse="symlink", links={"libvgpu.so.v2.6.0": "libvgpu.so.real"}),
]


def lay_out(case: Case, libdir: Path, vendor: Path) -> None:
    libdir.mkdir(parents=True, exist_ok=True)
    for name in case.files:
        shutil.copyfile(vendor, libdir / name)
    for name, to in case.links.items():
        (libdir / name).symlink_to(to)
    if case.preload is not None:
        (libdir / "ld.so.preload").write_text(case.preload)


def snapshot(libdir: Path) -> dict[str, bytes]:
    """Every regular file of the directory (not the state dir): what a refused or finished deploy left."""
    return {p.name: p.read_bytes() for p in libdir.iterdir() if p.is_file() and not p.is_symlink()}


@contextmanager
def mapping(case: Case, libdir: Path) -> Iterator[None]:
    """Hold the case's `mapped` file mapped in this process, as a running container would."""
    if case.mapped is None:
        yield
        return
    with open(libdir / case.mapped, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        yield
        del m


def check_outcome(case: Case, before: dict[str, bytes], libdir: Path, new: bytes, ok: bool, output: str) -> None:
    """A deploy of `new` replaced exactly the case's live file, or refused with its phrase and changed nothing."""
    after = snapshot(libdir)
    if case.refuse is not None:
        assert not ok and case.refuse in output, output
        assert after == before, f"{case.id}: a refused deploy changed files"
        return
    assert ok, output
    assert after[case.live] == new, f"{case.id}: {case.live} was not replaced: {output}"
    changed = sorted(n for n in before if n != case.live and after.get(n) != before[n])
    assert changed == [], f"{case.id}: also changed {changed}"
