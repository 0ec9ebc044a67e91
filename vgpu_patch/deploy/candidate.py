"""What the deploy needs to know about the file being deployed, read locally with the check's ELF reader.

The file named is read once, into a private snapshot (docs/design: release inputs are read once); its
sha256, ELF facts, signature and upload all come from that copy, never from the name again.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..elf.facts import image, read_facts
from ..elf.glibc import requirements_of
from ..elf.reader import MAX_BYTES
from ..release.digest import sha256_file
from ..release.provenance import MAX_BYTES as STATEMENT_MAX
from ..release.provenance import statement_path
from ..release.signing import signature_path
from ..report.errors import ElfError

__all__ = ["MACHINES", "OURS_RE", "Candidate", "inspect", "parse_glibc", "sha256_file", "snapshot",
           "verify_expected"]

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


SIG_MAX = 64 << 10  # an armored SSHSIG is under 1 KiB; of a larger `.sig` only this much is copied (and refused)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Snapshot:
    """A release input read once into a directory only this process can write: `path` is the copy (named as the
    source, so messages and `.sig` lookups read the same), `sha256` the hash of exactly the bytes copied."""

    source: Path
    path: Path
    sha256: str
    size: int
    owner: tempfile.TemporaryDirectory = field(repr=False, compare=False)  # removes the copy when dropped


@dataclass(frozen=True)
class Candidate:
    path: Path  # the private snapshot every check and the upload read (see snapshot)
    source: Path  # the file the operator named: messages, its build manifest
    size: int
    sha256: str
    machine: str  # e_machine name, e.g. EM_X86_64
    glibc_needed: tuple[int, int] | None  # highest GLIBC_x.y it imports
    glibc_private: bool
    ours_version: str | None  # from the embedded `vgpu-patch-shim <version>`
    snap: Snapshot | None = field(default=None, repr=False, compare=False)  # keeps `path` alive

    def runs_on(self, uname_m: str) -> bool:
        return uname_m in MACHINES.get(self.machine, (uname_m,))


def parse_glibc(text: str) -> tuple[int, int] | None:
    """`glibc 2.36`, `ldd (Debian GLIBC 2.36-9) 2.36` or `GLIBC_2.34` -> (2, 36)."""
    found = re.findall(r"(\d+)\.(\d+)", text)
    if not found:
        return None
    major, minor = found[-1]
    return int(major), int(minor)


def snapshot(source: Path | str, role: str = "candidate") -> Snapshot:
    """Read `source` once (bounded by the ELF reader's limit) into a new 0700 directory, with its `.sig`, its
    provenance statement and that one's `.sig` beside it when it has them; ElfError (one line, naming `source`)
    when it is not a regular file that reads whole."""
    source = Path(source)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)  # a FIFO must not block
    except FileNotFoundError:
        raise ElfError(f"{role} {source} does not exist; check the path") from None
    except OSError as e:
        raise ElfError(f"cannot read {role} {source}: {e.strerror}; check permissions") from None
    owner = tempfile.TemporaryDirectory(prefix="vgpu-patch-candidate-")  # mkdtemp: mode 0700, a fresh name
    copy = Path(owner.name) / (source.name or "candidate")
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise ElfError(f"{role} {source} is a directory; give the path of a .so file")
            if not stat.S_ISREG(st.st_mode):
                raise ElfError(f"{role} {source} is not a regular file; give the path of a .so file")
            if st.st_size > MAX_BYTES:  # before any read: a 20 GiB sparse file is refused at once
                raise ElfError(f"{role} {source} is {st.st_size} bytes, larger than any shared library this tool "
                               f"checks (limit {MAX_BYTES >> 20} MiB); give the built .so")
            digest, size = _copy_bounded(f, copy, st.st_size + 1)
        if size != st.st_size:
            raise ElfError(f"{role} {source} changed size while being read ({st.st_size} -> {size} bytes): "
                           "a writer is still at work on it (or it is a special file); rerun once it is whole")
        _copy_beside(signature_path(source), signature_path(copy), SIG_MAX)
        # the build's provenance statement and its signature (vgpu_patch/release/provenance.py), read once the same way
        _copy_beside(statement_path(source), statement_path(copy), STATEMENT_MAX)
        _copy_beside(signature_path(statement_path(source)), signature_path(statement_path(copy)), SIG_MAX)
    except BaseException:
        owner.cleanup()
        raise
    return Snapshot(source, copy, digest, size, owner)


def _copy_bounded(f: BinaryIO, copy: Path, limit: int) -> tuple[str, int]:
    """Copy at most `limit` bytes of `f` into a new read-only file `copy`; the sha256 and size of what was copied."""
    h, size = hashlib.sha256(), 0
    with open(copy, "xb") as out:
        while size < limit and (chunk := f.read(min(_CHUNK, limit - size))):
            h.update(chunk)
            out.write(chunk)
            size += len(chunk)
    copy.chmod(0o400)
    return h.hexdigest(), size


def _copy_beside(src: Path, dest: Path, limit: int) -> None:
    """A file beside the candidate (its `.sig`, its provenance), read once (at most `limit` + 1 bytes: more is not
    what it claims to be, and is refused as such) into `dest`, when it is a regular file."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # none (or unreadable): the copy has none either, and a check says so
    with os.fdopen(fd, "rb") as f:
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            dest.write_bytes(f.read(limit + 1))
            dest.chmod(0o400)


def inspect(path: Path | str) -> Candidate:
    """Read a candidate library once, into a private snapshot (see snapshot), and inspect that copy; ElfError (one
    line, naming `path`) if it is not a shared object we can reason about."""
    snap = snapshot(path)
    source, copy = snap.source, snap.path
    try:
        facts = read_facts(copy, role="candidate")  # bounded: refuses oversized and malformed files
        if facts.etype != "ET_DYN":
            raise ElfError(f"candidate {source} is not a shared object ({facts.etype}); give the built libvgpu.so")
        req = requirements_of(facts)  # the same glibc rule `check` applies
        with image(copy, "candidate") as img:
            m = img.search(OURS_RE)
            ours = m.group(1).decode() if m else None  # while mapped: the match points into the file
    except ElfError as e:  # the copy's name is ours: name the file the operator gave
        snap.owner.cleanup()
        raise ElfError(str(e).replace(str(copy), str(source))) from None
    return Candidate(
        path=copy,
        source=source,
        size=snap.size,
        sha256=snap.sha256,
        machine=facts.machine,
        glibc_needed=parse_glibc(req["max_version"]) if req["max_version"] else None,
        glibc_private=bool(req["glibc_private"]),
        ours_version=ours,
        snap=snap,
    )


def verify_expected(cand: Candidate, expect_sha256: str | None = None) -> None:
    """Refuse a FILE whose sha256 is not the one given, or not the one in its build manifest (FILE.json)."""
    import json

    from ..report.errors import IntegrityError, UsageError

    if expect_sha256 is not None:
        want = expect_sha256.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", want):
            raise UsageError(f"--expect-sha256 {expect_sha256!r}: give the 64 hex digits of the sha256")
        if want != cand.sha256:
            raise IntegrityError(f"{cand.source}: sha256 is {cand.sha256}, not --expect-sha256 {want}; "
                                 f"no node was touched: give the right file")
    manifest = cand.source.with_name(cand.source.name + ".json")
    if not manifest.is_file():
        return
    try:
        doc = json.loads(manifest.read_bytes())
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{manifest}: unreadable build manifest ({e}); rebuild, or remove it") from e
    recorded = doc.get("sha256") if isinstance(doc, dict) else None
    if not isinstance(recorded, str) or recorded.lower() != cand.sha256:
        raise IntegrityError(f"{cand.source}: sha256 {cand.sha256[:12]} does not match its build manifest {manifest} "
                             f"({str(recorded)[:12]}); the file changed after the build: rebuild it; "
                             f"no node was touched")
