"""A bounded reader for 64-bit little-endian ELF files: headers, sections, segments and the tables the
drop-in rules read (.dynamic, .dynsym, .gnu.version*, notes, .symtab).

Every loop is bounded by the file's real size, never by a count the file claims: the file is mapped,
not read whole (and refused above MAX_BYTES, so a huge sparse file costs nothing); every offset and
size is checked against the mapping before use; each table is walked at most (its bytes / entry size)
times; chains (.gnu.version_d/_r) only move forward inside their section; note sections together may
not cover more bytes than the file has. So a crafted `vn_cnt` or `sh_info` ends in one `Malformed`
line, in about the time it takes to read the file once.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

# A libvgpu.so is 0.1-2 MB and libc.so.6 about 2 MB: anything this big is not a file to check, and
# refusing it up front keeps a 20 GiB sparse file from being hashed or scanned for minutes.
MAX_BYTES = 256 << 20

EM_X86_64, EM_AARCH64 = 62, 183
MACHINES = {EM_X86_64: "EM_X86_64", EM_AARCH64: "EM_AARCH64"}
OSABIS = {0: "ELFOSABI_SYSV", 3: "ELFOSABI_LINUX", 6: "ELFOSABI_SOLARIS", 9: "ELFOSABI_FREEBSD",
          12: "ELFOSABI_OPENBSD", 97: "ELFOSABI_ARM", 255: "ELFOSABI_STANDALONE"}
ETYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
SYM_TYPES = {0: "STT_NOTYPE", 1: "STT_OBJECT", 2: "STT_FUNC", 3: "STT_SECTION", 4: "STT_FILE",
             5: "STT_COMMON", 6: "STT_TLS", 10: "STT_GNU_IFUNC"}
SYM_BINDS = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_GNU_UNIQUE"}
VISIBILITY = ("STV_DEFAULT", "STV_INTERNAL", "STV_HIDDEN", "STV_PROTECTED")

SHT_SYMTAB, SHT_STRTAB, SHT_DYNAMIC, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 3, 6, 7, 8, 11
SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_GNU_STACK = 1, 2, 3, 0x6474E551
SHN_UNDEF, SHN_ABS = 0, 0xFFF1
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH = 0, 1, 5, 10, 14, 15
DT_TEXTREL, DT_RUNPATH, DT_FLAGS, DT_RELR = 22, 29, 30, 36
NT_GNU_BUILD_ID, NT_GNU_PROPERTY_TYPE_0 = 3, 5
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
VER_FLG_BASE = 0x1

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
_VERDEF = struct.Struct("<HHHHIII")
_VERDAUX = struct.Struct("<II")
_VERNEED = struct.Struct("<HHIII")
_VERNAUX = struct.Struct("<IHHII")
_NOTE = struct.Struct("<III")


class Malformed(Exception):
    """The file breaks the ELF format in a way that stops reading; the message is one line."""


class Truncated(Malformed):
    """A header or table reaches past the end of the file."""


@dataclass(frozen=True)
class Section:
    index: int
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass(frozen=True)
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True)
class Symbol:
    name: str
    info: int
    other: int
    shndx: int

    @property
    def type(self) -> str:
        return SYM_TYPES.get(self.info & 0xF, str(self.info & 0xF))

    @property
    def bind(self) -> str:
        return SYM_BINDS.get(self.info >> 4, str(self.info >> 4))

    @property
    def visibility(self) -> str:
        return VISIBILITY[self.other & 3]


class ElfImage:
    """A mapped ELF file with its header, section and segment tables checked against its size."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        if size < _EHDR.size:
            raise Truncated(f"{size} bytes, shorter than an ELF header")
        if size > MAX_BYTES:
            raise Malformed(f"{size} bytes, larger than any shared library this tool checks "
                            f"(limit {MAX_BYTES >> 20} MiB)")
        self.size = size
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (ident, self.etype, self.machine, _ver, _entry, phoff, shoff, _flags, _ehsize,
         phentsize, phnum, shentsize, shnum, _shstrndx) = _EHDR.unpack_from(self._map, 0)
        self.ident = bytes(ident)
        self.osabi = ident[7]
        if phnum and phentsize != _PHDR.size:
            raise Malformed(f"e_phentsize is {phentsize}, not {_PHDR.size}")
        if shnum and shentsize != _SHDR.size:
            raise Malformed(f"e_shentsize is {shentsize}, not {_SHDR.size}")
        need = max(phoff + _PHDR.size * phnum, shoff + _SHDR.size * shnum)
        if need > size:
            raise Truncated(f"{size} bytes, its headers need {need}")
        self.segments = [Segment(t, fl, off, va, fs, ms) for t, fl, off, va, _pa, fs, ms, _al
                         in _PHDR.iter_unpack(self._map[phoff:phoff + _PHDR.size * phnum])]
        self.sections = [Section(i, *fields[1:]) for i, fields
                         in enumerate(_SHDR.iter_unpack(self._map[shoff:shoff + _SHDR.size * shnum]))]
        need = max([s.offset + s.filesz for s in self.segments]
                   + [s.offset + s.size for s in self.sections if s.type != SHT_NOBITS] + [0])
        if need > size:
            raise Truncated(f"{size} bytes, its headers need {need}")

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> ElfImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- raw access ---------------------------------------------------------------------------

    def data(self, sec: Section) -> bytes:
        return b"" if sec.type == SHT_NOBITS else self._map[sec.offset:sec.offset + sec.size]

    def blob(self, offset: int, size: int) -> bytes:
        if offset + size > self.size:
            raise Truncated(f"{self.size} bytes, a table at {offset:#x} needs {offset + size}")
        return self._map[offset:offset + size]

    def find(self, needle: bytes) -> int:
        return self._map.find(needle)

    def search(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        """The first match in the file (read the match before close(): it points into the map)."""
        return pattern.search(self._map)  # mmap is a bytes-like buffer

    def first(self, sh_type: int) -> Section | None:
        return next((s for s in self.sections if s.type == sh_type), None)

    def linked(self, sec: Section, what: str) -> bytes:
        """The string table `sec.sh_link` names."""
        if not 0 < sec.link < len(self.sections) or self.sections[sec.link].type != SHT_STRTAB:
            raise Malformed(f"{what} links to section {sec.link}, which is not a string table")
        return self.data(self.sections[sec.link])

    # --- tables -------------------------------------------------------------------------------

    def symbols(self, sec: Section, what: str) -> Iterator[Symbol]:
        """Every entry of a symbol table (index 0 included, so indices match .gnu.version)."""
        if sec.entsize != SYM.size:
            raise Malformed(f"{what} has entry size {sec.entsize}, not {SYM.size}")
        strtab = self.linked(sec, what)
        raw = self.data(sec)
        for st_name, info, other, shndx, _value, _size in SYM.iter_unpack(raw[:len(raw) - len(raw) % SYM.size]):
            yield Symbol(cstr(strtab, st_name, what), info, other, shndx)

    def dynamic(self) -> list[tuple[int, int | str]]:
        """(d_tag, value) up to DT_NULL; string-valued tags (NEEDED, SONAME, RPATH, RUNPATH) resolved."""
        sec = self.first(SHT_DYNAMIC)
        if sec is not None:
            raw, strtab = self.data(sec), self.linked(sec, ".dynamic")
        else:  # section headers partly stripped: the segment and DT_STRTAB still tell
            seg = next((s for s in self.segments if s.type == PT_DYNAMIC), None)
            if seg is None:
                return []
            raw, strtab = self.blob(seg.offset, seg.filesz), b""
            tags = dict(_DYN.iter_unpack(raw[:len(raw) - len(raw) % _DYN.size]))
            if DT_STRTAB in tags:
                strtab = self.blob(self.file_offset(tags[DT_STRTAB]), min(tags.get(DT_STRSZ, 0), self.size))
        out: list[tuple[int, int | str]] = []
        for tag, val in _DYN.iter_unpack(raw[:len(raw) - len(raw) % _DYN.size]):
            if tag == DT_NULL:
                break
            out.append((tag, cstr(strtab, val, ".dynamic") if tag in _STRING_TAGS else val))
        return out

    def file_offset(self, vaddr: int) -> int:
        for s in self.segments:
            if s.type == PT_LOAD and s.vaddr <= vaddr < s.vaddr + s.filesz:
                return s.offset + (vaddr - s.vaddr)
        raise Malformed(f"address {vaddr:#x} lies in no PT_LOAD segment")

    def interp(self) -> str | None:
        seg = next((s for s in self.segments if s.type == PT_INTERP), None)
        if seg is None:
            return None
        return self.blob(seg.offset, seg.filesz).split(b"\0", 1)[0].decode("utf-8", "replace")

    def notes(self) -> Iterator[tuple[bytes, int, bytes]]:
        """(name, type, desc) of every note in the SHT_NOTE sections."""
        budget = self.size  # sections may overlap only so far: a file's notes fit in the file
        for sec in self.sections:
            if sec.type != SHT_NOTE:
                continue
            budget -= sec.size
            if budget < 0:
                raise Malformed("note sections cover more bytes than the file has (they overlap)")
            yield from _iter_notes(self.data(sec), 8 if sec.align == 8 else 4)

    def verdefs(self) -> Iterator[tuple[int, int, str]]:
        """(vd_ndx, vd_flags, name) of each .gnu.version_d entry."""
        sec = self.first(SHT_GNU_VERDEF)
        if sec is None:
            return
        raw, strtab = self.data(sec), self.linked(sec, ".gnu.version_d")
        for off in _chain(raw, 0, sec.info, _VERDEF, ".gnu.version_d", next_field=6):
            _v, flags, ndx, cnt, _h, aux, _n = _VERDEF.unpack_from(raw, off)
            if cnt == 0:
                continue
            name, _next = _unpack(raw, off + aux, _VERDAUX, ".gnu.version_d")
            yield ndx, flags, cstr(strtab, name, ".gnu.version_d")

    def verneeds(self) -> Iterator[tuple[str, int, str]]:
        """(library, vna_other index, version name) of each .gnu.version_r requirement."""
        sec = self.first(SHT_GNU_VERNEED)
        if sec is None:
            return
        raw, strtab = self.data(sec), self.linked(sec, ".gnu.version_r")
        budget = len(raw) // _VERNAUX.size  # every entry of either kind takes 16 distinct bytes
        for off in _chain(raw, 0, sec.info, _VERNEED, ".gnu.version_r", next_field=4):
            _v, cnt, file, aux, _n = _VERNEED.unpack_from(raw, off)
            library = cstr(strtab, file, ".gnu.version_r")
            budget -= 1 + cnt
            if budget < 0:
                raise Malformed(".gnu.version_r claims more entries than its section holds")
            for aoff in _chain(raw, off + aux, cnt, _VERNAUX, ".gnu.version_r", next_field=4):
                _h, _f, other, name, _n = _VERNAUX.unpack_from(raw, aoff)
                yield library, other, cstr(strtab, name, ".gnu.version_r")

    def versym(self) -> tuple[int, ...]:
        sec = self.first(SHT_GNU_VERSYM)
        if sec is None:
            return ()
        raw = self.data(sec)
        return struct.unpack(f"<{len(raw) // 2}H", raw[:len(raw) // 2 * 2])


_STRING_TAGS = (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)


def open_image(path: str | os.PathLike[str]) -> ElfImage:
    """Map `path` (the caller has made sure it is a regular, non-empty ELF file)."""
    with open(path, "rb") as f:  # the mapping outlives the descriptor
        return ElfImage(f, os.fstat(f.fileno()).st_size)


# Symbol and version names are short; a window keeps a NUL-less crafted table from making each
# lookup scan to its end (quadratic in the table's size).
MAX_NAME = 16 << 10


def cstr(table: bytes, offset: int, what: str) -> str:
    if offset >= len(table):
        raise Malformed(f"{what} names a string at {offset:#x} outside its string table ({len(table)} bytes)")
    end = table.find(b"\0", offset, offset + MAX_NAME)
    if end < 0:
        raise Malformed(f"{what} names a string at {offset:#x} with no end within {MAX_NAME} bytes")
    return table[offset:end].decode("utf-8", "replace")


def _unpack(raw: bytes, off: int, st: struct.Struct, what: str) -> tuple:
    if off + st.size > len(raw):
        raise Malformed(f"{what} has an entry at {off:#x} past its end ({len(raw)} bytes)")
    return st.unpack_from(raw, off)


def _chain(raw: bytes, off: int, count: int, st: struct.Struct, what: str, *, next_field: int) -> Iterator[int]:
    """Offsets of the `count` entries linked by a relative `next` field (0 ends the chain).

    Forward only, each step at least one entry long, inside `raw`, and `count` no more than `raw`
    can hold: at most len(raw) / st.size steps, whatever the file claims. (pyelftools trusts the
    count and re-reads one entry `count` times when `next` is 0.)"""
    if count > len(raw) // st.size:
        raise Malformed(f"{what} claims {count} entries, more than its {len(raw)} bytes can hold")
    for i in range(count):
        fields = _unpack(raw, off, st, what)
        yield off
        step = fields[next_field]
        if step == 0:
            if i + 1 < count:
                raise Malformed(f"{what} claims {count} entries but links only {i + 1}")
            return
        if step < st.size:
            raise Malformed(f"{what} has an entry at {off:#x} whose next link ({step}) overlaps it")
        off += step


def _iter_notes(raw: bytes, align: int) -> Iterator[tuple[bytes, int, bytes]]:
    off = 0
    while off + _NOTE.size <= len(raw):  # each note moves off forward by at least 12 bytes
        namesz, descsz, ntype = _NOTE.unpack_from(raw, off)
        name_at = off + _NOTE.size
        desc_at = off + _align(_NOTE.size + namesz, align)  # gABI: desc starts aligned from the note
        if desc_at + descsz > len(raw):
            raise Malformed(f"a note at {off:#x} claims {namesz}+{descsz} bytes, past its section's end")
        yield raw[name_at:name_at + namesz].rstrip(b"\0"), ntype, raw[desc_at:desc_at + descsz]
        off += _align(desc_at - off + descsz, align)


def _align(n: int, a: int) -> int:
    return (n + a - 1) & ~(a - 1)


def gnu_properties(desc: bytes) -> Iterator[tuple[int, bytes]]:
    """(pr_type, pr_data) of a NT_GNU_PROPERTY_TYPE_0 note's properties (8-aligned in ELF64)."""
    off = 0
    while off + 8 <= len(desc):
        pr_type, datasz = struct.unpack_from("<II", desc, off)
        if off + 8 + datasz > len(desc):
            raise Malformed(f"a GNU property at {off:#x} claims {datasz} bytes, past its note's end")
        yield pr_type, desc[off + 8:off + 8 + datasz]
        off += 8 + _align(datasz, 8)
