"""What the deploy needs to know about the file being deployed, read locally with pyelftools."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ElfError

# e_machine -> the `uname -m` values of nodes that can load it
MACHINES = {
    "EM_X86_64": ("x86_64", "amd64"),
    "EM_AARCH64": ("aarch64", "arm64"),
    "EM_386": ("i386", "i486", "i586", "i686"),
    "EM_PPC64": ("ppc64le", "ppc64"),
    "EM_S390": ("s390x",),
    "EM_RISCV": ("riscv64",),
}
OURS_RE = re.compile(rb"vgpu-patch-shim ([0-9A-Za-z.+~_-]+)")


@dataclass(frozen=True)
class Candidate:
    path: Path
    size: int
    sha256: str
    machine: str  # e_machine name, e.g. EM_X86_64
    glibc_needed: tuple[int, int] | None  # highest GLIBC_x.y it imports
    glibc_private: bool
    ours_version: str | None  # from the embedded `vgpu-patch-shim <version>`

    def runs_on(self, uname_m: str) -> bool:
        return uname_m in MACHINES.get(self.machine, (uname_m,))


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_glibc(text: str) -> tuple[int, int] | None:
    """`glibc 2.36`, `ldd (Debian GLIBC 2.36-9) 2.36` or `GLIBC_2.34` -> (2, 36)."""
    found = re.findall(r"(\d+)\.(\d+)", text)
    if not found:
        return None
    major, minor = found[-1]
    return int(major), int(minor)


def _glibc_needs(path: Path) -> tuple[tuple[int, int] | None, bool]:
    try:  # prefer the check helper's reading when it is there: one rule for `check` and `deploy`
        from ..elfcheck import glibc_requirements

        req = glibc_requirements(path)
        top = req.get("max_version")
        return (parse_glibc(top) if top else None), bool(req.get("glibc_private"))
    except (ImportError, AttributeError, TypeError):
        names = _version_needs(path)
    private = any("GLIBC_PRIVATE" in n for n in names)
    # GLIBC_ABI_DT_RELR marks a library a loader older than 2.36 refuses
    found = [(2, 36) if n == "GLIBC_ABI_DT_RELR" else parse_glibc(n) for n in names if "PRIVATE" not in n]
    versions = [v for v in found if v is not None]
    return (max(versions) if versions else None), private


def _version_needs(path: Path) -> list[str]:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    names: list[str] = []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if isinstance(sec, GNUVerNeedSection):
                for _verneed, auxes in sec.iter_versions():
                    names += [aux.name for aux in auxes if aux.name.startswith("GLIBC_")]
    return names


def inspect(path: Path | str) -> Candidate:
    """Read a candidate library; ElfError if it is not a shared object we can reason about."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ElfError(f"{path}: cannot read ({e.strerror}); give the built libvgpu.so") from e
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_type"] != "ET_DYN":
                raise ElfError(f"{path}: not a shared object (e_type {elf['e_type']}); give the built libvgpu.so")
            machine = elf["e_machine"]
        glibc, private = _glibc_needs(path)
    except ELFError as e:
        raise ElfError(f"{path}: not a readable ELF file ({e}); give the built libvgpu.so") from e
    m = OURS_RE.search(data)
    return Candidate(
        path=path,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        machine=machine,
        glibc_needed=glibc,
        glibc_private=private,
        ours_version=m.group(1).decode() if m else None,
    )


def verify_expected(cand: Candidate, expect_sha256: str | None = None) -> None:
    """Refuse a FILE whose sha256 is not the one given, or not the one in its build manifest (FILE.json)."""
    import json

    from ..errors import IntegrityError, UsageError

    if expect_sha256 is not None:
        want = expect_sha256.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", want):
            raise UsageError(f"--expect-sha256 {expect_sha256!r}: give the 64 hex digits of the sha256")
        if want != cand.sha256:
            raise IntegrityError(f"{cand.path}: sha256 is {cand.sha256}, not --expect-sha256 {want}; "
                                 f"no node was touched: give the right file")
    manifest = cand.path.with_name(cand.path.name + ".json")
    if not manifest.is_file():
        return
    try:
        doc = json.loads(manifest.read_bytes())
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{manifest}: unreadable build manifest ({e}); rebuild, or remove it") from e
    recorded = doc.get("sha256") if isinstance(doc, dict) else None
    if not isinstance(recorded, str) or recorded.lower() != cand.sha256:
        raise IntegrityError(f"{cand.path}: sha256 {cand.sha256[:12]} does not match its build manifest {manifest} "
                             f"({str(recorded)[:12]}); the file changed after the build: rebuild it; "
                             f"no node was touched")
