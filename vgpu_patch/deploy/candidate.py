"""What the deploy needs to know about the file being deployed, read locally with the check's ELF reader."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..digest import sha256_file
from ..elf.facts import image, read_facts
from ..elf.glibc import requirements_of
from ..errors import ElfError

__all__ = ["MACHINES", "OURS_RE", "Candidate", "inspect", "parse_glibc", "sha256_file"]

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
