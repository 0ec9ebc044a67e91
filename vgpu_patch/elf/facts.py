"""Read every ELF fact the drop-in rules need, in one pass, with pyelftools (never readelf).

Bad input (missing, empty, a directory, not ELF, truncated, 32-bit, big-endian, an unknown machine)
becomes one `ElfError` line naming the file and what to do; a traceback would only confuse scripts.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable

from elftools.elf.elffile import ELFFile

from ..errors import ElfError

# e_machine (pyelftools name) -> the arch names the CLI speaks.
ARCHES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}
PF_X = 0x1
DF_TEXTREL = 0x4
VERSYM_HIDDEN = 0x8000
_OTHER_MACHINES = {3: "i386", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 22: "s390", 40: "ARM (32-bit)",
                   243: "RISC-V", 258: "LoongArch"}
_UNDEF = "SHN_UNDEF"


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
    machine: str  # pyelftools e_machine name, e.g. EM_X86_64
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
    _symtab_memo: dict = field(default_factory=dict, repr=False, compare=False)

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
        with _open(self.path) as f:
            try:
                found = _scan_symtab(ELFFile(f), wanted)
            except Exception as e:  # corrupt .symtab: one line, like every other read error
                raise _corrupt(self.path, e) from None
        self._symtab_memo[wanted] = found
        return found


_BINDS = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_GNU_UNIQUE"}
_VISIBILITY = ("STV_DEFAULT", "STV_INTERNAL", "STV_HIDDEN", "STV_PROTECTED")
_SYM64 = struct.Struct("<IBBHQQ")


def _scan_symtab(elf: ELFFile, wanted: frozenset[str]) -> dict[str, tuple[str, str]]:
    """Find `wanted` definitions in .symtab. Raw struct decoding: an unstripped 1 MB library has
    thousands of local symbols and pyelftools' per-symbol parsing costs ~25 us each."""
    symtab = elf.get_section_by_name(".symtab")
    if symtab is None or symtab["sh_entsize"] != _SYM64.size:
        return {}
    strtab = elf.get_section(symtab["sh_link"]).data()
    keys = {n.encode() for n in wanted}
    found: dict[str, tuple[str, str]] = {}
    for st_name, st_info, st_other, st_shndx, _, _ in _SYM64.iter_unpack(symtab.data()):
        if st_shndx == 0:  # SHN_UNDEF
            continue
        name = strtab[st_name:strtab.find(b"\0", st_name)]
        if name in keys:
            found[name.decode()] = (_BINDS.get(st_info >> 4, str(st_info >> 4)), _VISIBILITY[st_other & 3])
    return found


def read_facts(path: Path, *, role: str = "candidate") -> ElfFacts:
    """Parse `path`; raise ElfError (one line) when it is not a readable 64-bit little-endian ELF."""
    path = Path(path)
    with _open(path, role) as f:
        size = _preflight(f, path, role)
        try:
            elf = ELFFile(f)
            sections = list(elf.iter_sections())  # pyelftools re-parses headers per iteration
            _check_extents(elf, sections, path, size, role)
            facts = ElfFacts(
                path=path,
                size=size,
                machine=str(elf["e_machine"]),
                osabi=str(elf["e_ident"]["EI_OSABI"]),
                etype=str(elf["e_type"]),
            )
            _read_segments(elf, facts)
            _read_dynamic(elf, sections, facts)
            _read_notes(elf, sections, facts)
            _read_symbols(sections, facts)
        except ElfError:
            raise
        except Exception as e:  # pyelftools/construct raise many types on corrupt input
            raise _corrupt(path, e, role) from None
    return facts


def open_checked(path: Path, role: str) -> tuple[BinaryIO, int]:
    """Open and preflight a file for a caller that reads only part of it (e.g. libc's version defs)."""
    f = _open(path, role)
    try:
        return f, _preflight(f, path, role)
    except BaseException:
        f.close()
        raise


def corrupt_error(path: Path, exc: Exception, role: str = "candidate") -> ElfError:
    return _corrupt(path, exc, role)


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
    size = f.seek(0, 2)
    f.seek(0)
    ident = f.read(64)
    if size == 0:
        raise ElfError(f"{role} {path} is empty; rebuild or re-copy it")
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
    if shnum == 0:  # pyelftools reads symbols and versions from sections only
        raise ElfError(f"{role} {path} has no section headers (sstrip'ed?); check the build before stripping")
    return size


def _check_extents(elf: ELFFile, sections: list, path: Path, size: int, role: str) -> None:
    """A truncated copy parses lazily into garbage; compare every header's extent with the size."""
    need = max(elf["e_phoff"] + elf["e_phnum"] * elf["e_phentsize"],
               elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"])
    if need <= size:
        for seg in elf.iter_segments():
            need = max(need, seg["p_offset"] + seg["p_filesz"])
        for sec in sections:
            if sec["sh_type"] != "SHT_NOBITS":
                need = max(need, sec["sh_offset"] + sec["sh_size"])
    if need > size:
        raise ElfError(f"{role} {path} is truncated ({size} bytes, its headers need {need}); re-copy or rebuild it")


def _corrupt(path: Path, exc: Exception, role: str = "candidate") -> ElfError:
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return ElfError(f"{role} {path} is a corrupt ELF ({type(exc).__name__}: {first}); rebuild or re-copy it")


# --- readers ----------------------------------------------------------------------------------


def _read_segments(elf: ELFFile, facts: ElfFacts) -> None:
    for seg in elf.iter_segments():
        kind = seg["p_type"]
        if kind == "PT_INTERP":
            facts.interp = seg.get_interp_name()
        elif kind == "PT_GNU_STACK":
            facts.stack_flags = seg["p_flags"]


def _dynamic(elf: ELFFile, sections: list):
    for sec in sections:
        if sec["sh_type"] == "SHT_DYNAMIC":
            return sec
    for seg in elf.iter_segments():  # section headers stripped
        if seg["p_type"] == "PT_DYNAMIC":
            return seg
    return None


def _read_dynamic(elf: ELFFile, sections: list, facts: ElfFacts) -> None:
    dyn = _dynamic(elf, sections)
    if dyn is None:
        return
    for tag in dyn.iter_tags():
        kind = tag["d_tag"]
        if kind == "DT_NEEDED":
            facts.needed.append(tag.needed)
        elif kind == "DT_SONAME":
            facts.soname = tag.soname
        elif kind == "DT_RPATH":
            facts.rpath.append(tag.rpath)
        elif kind == "DT_RUNPATH":
            facts.runpath.append(tag.runpath)
        elif kind == "DT_TEXTREL":
            facts.textrel = True
        elif kind == "DT_RELR":
            facts.relr = True
        elif kind == "DT_FLAGS" and tag["d_val"] & DF_TEXTREL:
            facts.textrel = True
        elif kind == "DT_NULL":
            break


def _notes(elf: ELFFile, sections: list):
    notes = [s for s in sections if s["sh_type"] == "SHT_NOTE"]
    if sections:
        for sec in notes:
            yield from sec.iter_notes()
        return
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_NOTE":
            yield from seg.iter_notes()


def _read_notes(elf: ELFFile, sections: list, facts: ElfFacts) -> None:
    for note in _notes(elf, sections):
        if note["n_type"] == "NT_GNU_BUILD_ID":
            facts.build_id = note["n_desc"]
        elif note["n_type"] == "NT_GNU_PROPERTY_TYPE_0":
            for prop in note["n_desc"]:
                if prop["pr_type"] == "GNU_PROPERTY_X86_ISA_1_NEEDED" and isinstance(prop["pr_data"], int):
                    facts.x86_isa_needed = (facts.x86_isa_needed or 0) | prop["pr_data"]


def _read_symbols(sections: list, facts: ElfFacts) -> None:
    dynsym = verdef = verneed = versym = None
    for sec in sections:
        kind = sec["sh_type"]
        if kind == "SHT_DYNSYM":
            dynsym = sec
        elif kind == "SHT_GNU_verdef":
            verdef = sec
        elif kind == "SHT_GNU_verneed":
            verneed = sec
        elif kind == "SHT_GNU_versym":
            versym = sec
        elif kind == "SHT_SYMTAB":
            facts.has_symtab = True
    if dynsym is None:
        return

    # version index -> (name, library or None for our own definitions)
    versions: dict[int, tuple[str, str | None]] = {}
    if verdef is not None:
        for vd, auxs in verdef.iter_versions():
            name = next(iter(auxs)).name
            if vd["vd_flags"] & 0x1:  # VER_FLG_BASE: the file's own name, not a version node
                continue
            versions[vd["vd_ndx"]] = (name, None)
            facts.version_defs.append(name)
    if verneed is not None:
        for vn, auxs in verneed.iter_versions():
            for aux in auxs:
                versions[aux["vna_other"]] = (aux.name, vn.name)
    # .gnu.version is a plain array of u16, one per .dynsym entry: read it raw, not entry by entry.
    indices: tuple[int, ...] = ()
    if versym is not None:
        raw = versym.data()
        indices = struct.unpack(f"<{len(raw) // 2}H", raw[: len(raw) // 2 * 2])

    for i, sym in enumerate(dynsym.iter_symbols()):
        if i == 0 or not sym.name:
            continue
        ndx = indices[i] if i < len(indices) else 1
        ver = versions.get(ndx & 0x7FFF)
        info = sym["st_info"]
        if sym["st_shndx"] == _UNDEF:
            facts.imports.append(Import(sym.name, ver[0] if ver else None, ver[1] if ver else None,
                                        info["bind"] == "STB_WEAK"))
            continue
        if info["bind"] == "STB_LOCAL":
            continue
        old = facts.exports.get(sym.name)
        if old is not None and not old.hidden_version:
            continue  # name@@DEFAULT already recorded; an older name@V beside it changes nothing
        facts.exports[sym.name] = DynSymbol(
            name=sym.name,
            type=str(info["type"]),  # pyelftools gives a bare int for values it has no name for
            bind=str(info["bind"]),
            visibility=str(sym["st_other"]["visibility"]),
            absolute=sym["st_shndx"] == "SHN_ABS",
            version=ver[0] if ver and ver[1] is None else None,
            hidden_version=bool(ndx & VERSYM_HIDDEN),
        )
