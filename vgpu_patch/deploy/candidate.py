"""What the deploy needs to know about the file being deployed, read locally with the check's ELF reader."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..digest import sha256_file
from ..elf.facts import image, read_facts
from ..elf.glibc import requirements_of
from ..errors import ElfError

__all__ = ["MACHINES", "OURS_RE", "Candidate", "inspect", "parse_glibc", "sha256_file", "verify_expected"]

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


def parse_glibc(text: str) -> tuple[int, int] | None:
    """`glibc 2.36`, `ldd (Debian GLIBC 2.36-9) 2.36` or `GLIBC_2.34` -> (2, 36)."""
    found = re.findall(r"(\d+)\.(\d+)", text)
    if not found:
        return None
    major, minor = found[-1]
    return int(major), int(minor)


def inspect(path: Path | str) -> Candidate:
    """Read a candidate library; ElfError (one line) if it is not a shared object we can reason about."""
    path = Path(path)
    facts = read_facts(path, role="candidate")  # bounded: refuses oversized and malformed files
    if facts.etype != "ET_DYN":
        raise ElfError(f"candidate {path} is not a shared object ({facts.etype}); give the built libvgpu.so")
    req = requirements_of(facts)  # the same glibc rule `check` applies
    with image(path, "candidate") as img:
        m = img.search(OURS_RE)
        ours = m.group(1).decode() if m else None  # while mapped: the match points into the file
    return Candidate(
        path=path,
        size=facts.size,
        sha256=sha256_file(path),
        machine=facts.machine,
        glibc_needed=parse_glibc(req["max_version"]) if req["max_version"] else None,
        glibc_private=bool(req["glibc_private"]),
        ours_version=ours,
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
