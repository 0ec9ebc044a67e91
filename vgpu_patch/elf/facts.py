"""Read every ELF fact the drop-in rules need, in one pass, with the bounded reader (reader.py).

Bad input (missing, empty, a directory, not ELF, truncated, 32-bit, big-endian, an unknown machine,
oversized, or any table that breaks the format) becomes one `ElfError` line naming the file and what
to do; a traceback would only confuse scripts.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..report.errors import ElfError
from . import reader as R

# e_machine name -> the arch names the CLI speaks.
ARCHES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}
PF_X = 0x1
DF_TEXTREL = 0x4
VERSYM_HIDDEN = 0x8000
_OTHER_MACHINES = {3: "i386", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 22: "s390", 40: "ARM (32-bit)",
                   243: "RISC-V", 258: "LoongArch"}


@dataclass(frozen=True)
class DynSymbol:
    """A symbol the file defines in .dynsym (what other objects can bind to)."""

    name: str
    type: str  # STT_FUNC, STT_GNU_IFUNC, STT_OBJECT, STT_TLS, STT_NOTYPE, ...
    bind: str  # STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE
    visibility: str  # STV_DEFAULT, STV_PROTECTED, ...
    absolute: bool  # st_shndx == SHN_ABS (version-node markers, linker symbols)
    version: str | None  # version node from .gnu.version_d; None when unversioned
    hidden_version: bool  # defined only as name@VER, which unversioned references cannot reach


@dataclass(frozen=True)
class Import:
    """An undefined .dynsym symbol and the version it requires (from .gnu.version_r)."""

    name: str
    version: str | None
    library: str | None
    weak: bool


@dataclass
class ElfFacts:
    path: Path
    size: int
    machine: str  # e_machine name, e.g. EM_X86_64
    osabi: str  # ELFOSABI_SYSV, ELFOSABI_LINUX, ...
    etype: str  # ET_DYN, ET_EXEC, ET_REL
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    textrel: bool = False
    relr: bool = False  # DT_RELR: packed relocations that glibc < 2.36 silently ignores
    interp: str | None = None
    stack_flags: int | None = None  # PT_GNU_STACK p_flags; None when the segment is missing
    build_id: str | None = None
    x86_isa_needed: int | None = None  # GNU_PROPERTY_X86_ISA_1_NEEDED bitmask
    exports: dict[str, DynSymbol] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)
    version_defs: list[str] = field(default_factory=list)  # non-base .gnu.version_d names
    has_symtab: bool = False
    _symtab_memo: dict[frozenset[str], dict[str, tuple[str, str]]] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def arch(self) -> str | None:
        return ARCHES.get(self.machine)

    def symtab_definitions(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """name -> (bind, visibility) for `names` defined in .symtab but absent from .dynsym.

        Read only when a surface name is missing, to tell "hidden by visibility/version script"
        from "not compiled in"; a stripped file has no .symtab and answers {}.
        """
        wanted = frozenset(names)
        if not wanted or not self.has_symtab:
            return {}
        if wanted in self._symtab_memo:
            return self._symtab_memo[wanted]
        with image(self.path, "candidate") as img:
            sec = img.first(R.SHT_SYMTAB)
            found = _scan_symtab(img, sec, wanted) if sec is not None else {}
        self._symtab_memo[wanted] = found
        return found


def _scan_symtab(img: R.ElfImage, sec: R.Section, wanted: frozenset[str]) -> dict[str, tuple[str, str]]:
    """Find `wanted` definitions in .symtab (an unstripped library has thousands of locals)."""
    found: dict[str, tuple[str, str]] = {}
    for sym in img.symbols(sec, ".symtab"):
        if sym.shndx != R.SHN_UNDEF and sym.name in wanted:
            found[sym.name] = (sym.bind, sym.visibility)
    return found


def read_facts(path: Path, *, role: str = "candidate") -> ElfFacts:
    """Parse `path`; raise ElfError (one line) when it is not a readable 64-bit little-endian ELF."""
    path = Path(path)
    with image(path, role) as img:
        facts = ElfFacts(
            path=path,
            size=img.size,
            machine=R.MACHINES[img.machine],
            osabi=R.OSABIS.get(img.osabi, f"ELFOSABI_{img.osabi}"),
            etype=R.ETYPES.get(img.etype, f"ET_{img.etype:#x}"),
        )
        _read_segments(img, facts)
        _read_dynamic(img, facts)
        _read_notes(img, facts)
        _read_symbols(img, facts)
    return facts


def version_defs(path: Path, role: str) -> list[str]:
    """The version names a library defines (.gnu.version_d), its own base name left out."""
    with image(Path(path), role) as img:
        return [name for _ndx, flags, name in img.verdefs() if not flags & R.VER_FLG_BASE]


@contextmanager
def image(path: Path, role: str) -> Iterator[R.ElfImage]:
    """The checked, mapped file; every reader error becomes one ElfError line naming `path`."""
    with _open(path, role) as f:
        size = _preflight(f, path, role)
    try:
        img = R.open_image(path)
    except R.Truncated as e:
        raise ElfError(f"{role} {path} is truncated ({e}); re-copy or rebuild it") from None
    except (R.Malformed, OSError, ValueError) as e:
        raise _corrupt(path, e, role) from None
    try:
        if img.size != size:
            raise R.Malformed(f"changed size while being read ({size} -> {img.size} bytes)")
        yield img
    except R.Malformed as e:
        raise _corrupt(path, e, role) from None
    finally:
        img.close()


# --- input validation -------------------------------------------------------------------------


def _open(path: Path, role: str = "candidate") -> BinaryIO:
    if path.is_dir():
        raise ElfError(f"{role} {path} is a directory; give the path of a .so file")
    if path.exists() and not path.is_file():  # a FIFO or device would block or never end
        raise ElfError(f"{role} {path} is not a regular file; give the path of a .so file")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise ElfError(f"{role} {path} does not exist; check the path") from None
    except OSError as e:
        raise ElfError(f"cannot read {role} {path}: {e.strerror}; check permissions") from None


def _preflight(f: BinaryIO, path: Path, role: str) -> int:
    try:
        size = f.seek(0, 2)
        f.seek(0)
        ident = f.read(64)
    except OSError as e:  # /proc/self/maps: a "regular" file that cannot seek to its end
        raise ElfError(f"{role} {path} cannot be read to its end ({e.strerror}): a /proc or special file, not a "
                       "library; give the path of a .so file") from None
    if size == 0:
        raise ElfError(f"{role} {path} is empty; rebuild or re-copy it")
    if size > R.MAX_BYTES:  # before any scan or hash: a 20 GiB sparse file is refused at once
        raise ElfError(f"{role} {path} is {size} bytes, larger than any shared library this tool checks "
                       f"(limit {R.MAX_BYTES >> 20} MiB); give the built .so")
    if not ident.startswith(b"\x7fELF"):
        raise ElfError(f"{role} {path} is not an ELF file (starts with {ident[:4]!r}); give the built .so")
    if len(ident) < 64:
        raise ElfError(f"{role} {path} is truncated ({size} bytes, shorter than an ELF header); re-copy it")
    if ident[4] == 1:
        raise ElfError(f"{role} {path} is a 32-bit ELF; only 64-bit x86_64 and aarch64 builds are supported")
    if ident[4] != 2:
        raise ElfError(f"{role} {path} has an invalid ELF class byte {ident[4]}; the file is corrupt")
    if ident[5] != 1:
        raise ElfError(f"{role} {path} is big-endian or corrupt (EI_DATA={ident[5]}); build for x86_64 or aarch64")
    (machine,) = struct.unpack_from("<H", ident, 18)
    if machine not in (62, 183):  # EM_X86_64, EM_AARCH64
        name = _OTHER_MACHINES.get(machine, f"e_machine {machine}")
        raise ElfError(f"{role} {path} is built for {name}; only x86_64 and aarch64 are supported")
    phoff, shoff = struct.unpack_from("<QQ", ident, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", ident, 54)
    need = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if need > size:
        raise ElfError(f"{role} {path} is truncated ({size} bytes, its headers need {need}); re-copy or rebuild it")
    if shnum == 0:  # symbols and versions are read from sections only
        raise ElfError(f"{role} {path} has no section headers (sstrip'ed?); check the build before stripping")
    return size


def _corrupt(path: Path, exc: Exception, role: str = "candidate") -> ElfError:
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return ElfError(f"{role} {path} is a corrupt ELF ({first or type(exc).__name__}); rebuild or re-copy it")


# --- readers ----------------------------------------------------------------------------------


def _read_segments(img: R.ElfImage, facts: ElfFacts) -> None:
    facts.interp = img.interp()
    for seg in img.segments:
        if seg.type == R.PT_GNU_STACK:
            facts.stack_flags = seg.flags


def _read_dynamic(img: R.ElfImage, facts: ElfFacts) -> None:
    for tag, val in img.dynamic():
        if tag == R.DT_NEEDED:
            facts.needed.append(str(val))
        elif tag == R.DT_SONAME:
            facts.soname = str(val)
        elif tag == R.DT_RPATH:
            facts.rpath.append(str(val))
        elif tag == R.DT_RUNPATH:
            facts.runpath.append(str(val))
        elif tag == R.DT_TEXTREL:
            facts.textrel = True
        elif tag == R.DT_RELR:
            facts.relr = True
        elif tag == R.DT_FLAGS and isinstance(val, int) and val & DF_TEXTREL:
            facts.textrel = True


def _read_notes(img: R.ElfImage, facts: ElfFacts) -> None:
    for name, ntype, desc in img.notes():
        if name != b"GNU":
            continue
        if ntype == R.NT_GNU_BUILD_ID:
            facts.build_id = desc.hex()
        elif ntype == R.NT_GNU_PROPERTY_TYPE_0:
            for pr_type, data in R.gnu_properties(desc):
                if pr_type == R.GNU_PROPERTY_X86_ISA_1_NEEDED and len(data) == 4:
                    facts.x86_isa_needed = (facts.x86_isa_needed or 0) | struct.unpack("<I", data)[0]


def _read_symbols(img: R.ElfImage, facts: ElfFacts) -> None:
    facts.has_symtab = img.first(R.SHT_SYMTAB) is not None
    dynsym = img.first(R.SHT_DYNSYM)
    if dynsym is None:
        return
    # version index -> (name, library or None for our own definitions)
    versions: dict[int, tuple[str, str | None]] = {}
    for ndx, flags, name in img.verdefs():
        if flags & R.VER_FLG_BASE:  # the file's own name, not a version node
            continue
        versions[ndx] = (name, None)
        facts.version_defs.append(name)
    for library, other, name in img.verneeds():
        versions[other] = (name, library)
    indices = img.versym()  # one u16 per .dynsym entry

    for i, sym in enumerate(img.symbols(dynsym, ".dynsym")):
        if i == 0 or not sym.name:
            continue
        ndx = indices[i] if i < len(indices) else 1
        ver = versions.get(ndx & 0x7FFF)
        if sym.shndx == R.SHN_UNDEF:
            facts.imports.append(Import(sym.name, ver[0] if ver else None, ver[1] if ver else None,
                                        sym.bind == "STB_WEAK"))
            continue
        if sym.bind == "STB_LOCAL":
            continue
        old = facts.exports.get(sym.name)
        if old is not None and not old.hidden_version:
            continue  # name@@DEFAULT already recorded; an older name@V beside it changes nothing
        facts.exports[sym.name] = DynSymbol(
            name=sym.name,
            type=sym.type,
            bind=sym.bind,
            visibility=sym.visibility,
            absolute=sym.shndx == R.SHN_ABS,
            version=ver[0] if ver and ver[1] is None else None,
            hidden_version=bool(ndx & VERSYM_HIDDEN),
        )
