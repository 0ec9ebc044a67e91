"""The ELF reader is bounded by the file's real size: crafted counts, overlapping tables and huge
sparse files end in one ElfError line, fast; and on real libraries it agrees with pyelftools.

Every crafted file starts as a real gcc-built .so (the `built` fixtures) and has one field changed.
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from vgpu_patch.deploy.candidate import inspect
from vgpu_patch.elf.check import check_file, glibc_floor_of_libc
from vgpu_patch.elf.facts import read_facts
from vgpu_patch.report.errors import ElfError

SHDR = struct.Struct("<IIQQQQIIQQ")
FAST_S = 1.0  # "well under a second per MB": every crafted file here is under 1 MB, or refused unread


def _sections(data: bytes) -> list[tuple[int, tuple]]:
    """(header offset, header fields) of every section, read with struct (independent of the tool)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, = struct.unpack_from("<H", data, 0x3C)
    return [(shoff + i * 64, SHDR.unpack_from(data, shoff + i * 64)) for i in range(shnum)]


def _section(data: bytes, sh_type: int) -> tuple[int, tuple]:
    return next(s for s in _sections(data) if s[1][1] == sh_type)


def _refused_fast(path: Path, what: str) -> str:
    start = time.monotonic()
    with pytest.raises(ElfError) as e:
        check_file(path)
    took = time.monotonic() - start
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and what in msg, msg
    assert took < FAST_S, f"{took:.2f}s for {path.stat().st_size} bytes"
    return msg


VERNEED, VERDEF, DYNSYM, NOTE = 0x6FFFFFFE, 0x6FFFFFFD, 11, 7


def _patch(src: Path, dst: Path, edits: list[tuple[int, str, int]]) -> Path:
    data = bytearray(src.read_bytes())
    for off, fmt, value in edits:
        struct.pack_into(fmt, data, off, value)
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture
def lib(built: dict[str, Path]) -> Path:
    return built["glibc-2.34"]  # needs libc versions: a non-empty .gnu.version_r


def test_a_huge_verneed_count_in_sh_info_is_refused(lib: Path, tmp_path: Path) -> None:
    hdr, _ = _section(lib.read_bytes(), VERNEED)
    bad = _patch(lib, tmp_path / "sh_info.so", [(hdr + 44, "<I", 0xFFFFFFFF)])
    _refused_fast(bad, ".gnu.version_r claims 4294967295 entries")


def test_a_verneed_chain_that_ends_before_its_count_is_refused(lib: Path, tmp_path: Path) -> None:
    data = lib.read_bytes()
    hdr, (_, _, _, _, off, size, *_rest) = _section(data, VERNEED)
    count = size // 16  # as many as fit: the chain (vn_next = 0 after one) cannot supply them
    bad = _patch(lib, tmp_path / "short.so", [(hdr + 44, "<I", count), (off + 12, "<I", 0)])
    _refused_fast(bad, "links only 1")


def test_a_huge_vernaux_count_is_refused(lib: Path, tmp_path: Path) -> None:
    _hdr, (_, _, _, _, off, *_rest) = _section(lib.read_bytes(), VERNEED)
    bad = _patch(lib, tmp_path / "vn_cnt.so", [(off + 2, "<H", 0xFFFF)])  # pyelftools: 65535 re-reads each
    _refused_fast(bad, "claims more entries than its section holds")


def test_a_vernaux_link_that_points_back_into_itself_is_refused(lib: Path, tmp_path: Path) -> None:
    _hdr, (_, _, _, _, off, *_rest) = _section(lib.read_bytes(), VERNEED)
    aux = off + struct.unpack_from("<I", lib.read_bytes(), off + 8)[0]
    bad = _patch(lib, tmp_path / "vna_next.so", [(off + 2, "<H", 2), (aux + 12, "<I", 4)])
    _refused_fast(bad, "overlaps it")


def test_a_huge_verdef_count_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    lib = built["hidden-version"]  # defines VGPU_1.0: has a .gnu.version_d
    hdr, _ = _section(lib.read_bytes(), VERDEF)
    bad = _patch(lib, tmp_path / "verdef.so", [(hdr + 44, "<I", 0x7FFFFFFF)])
    _refused_fast(bad, ".gnu.version_d claims")


def test_a_wrong_dynsym_entry_size_is_refused(lib: Path, tmp_path: Path) -> None:
    hdr, _ = _section(lib.read_bytes(), DYNSYM)
    bad = _patch(lib, tmp_path / "entsize.so", [(hdr + 56, "<Q", 1)])  # 24x the symbols, all garbage
    _refused_fast(bad, "entry size 1")


def test_a_symbol_name_outside_its_string_table_is_refused(lib: Path, tmp_path: Path) -> None:
    _hdr, (_, _, _, _, off, *_rest) = _section(lib.read_bytes(), DYNSYM)
    bad = _patch(lib, tmp_path / "st_name.so", [(off + 24, "<I", 0x7FFFFFF0)])
    _refused_fast(bad, "outside its string table")


def test_a_string_table_without_nul_is_refused_without_quadratic_scans(lib: Path, tmp_path: Path) -> None:
    data = bytearray(lib.read_bytes())
    _hdr, (_, _, _, _, _off, _size, link, *_rest) = _section(bytes(data), DYNSYM)
    _, (_, _, _, _, str_off, str_size, *_r) = _sections(bytes(data))[link]
    data[str_off:str_off + str_size] = b"A" * str_size
    bad = tmp_path / "no-nul.so"
    bad.write_bytes(bytes(data))
    _refused_fast(bad, "string")


def test_note_sections_that_overlap_many_times_are_refused(lib: Path, tmp_path: Path) -> None:
    """65535 section headers, each a note over the whole file: the notes' budget is the file's size."""
    data = bytearray(lib.read_bytes())
    size = len(data) + 65535 * 64
    note = SHDR.pack(0, NOTE, 0, 0, 0, len(data), 0, 0, 4, 0)
    table = SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0) + note * 65534
    struct.pack_into("<Q", data, 0x28, len(data))
    struct.pack_into("<HHH", data, 0x3A, 64, 65535, 0)
    bad = tmp_path / "notes.so"
    bad.write_bytes(bytes(data) + table)
    assert bad.stat().st_size == size
    _refused_fast(bad, "corrupt ELF")


def test_a_20_gib_sparse_file_is_refused_at_once(lib: Path, tmp_path: Path) -> None:
    import resource

    bad = tmp_path / "sparse.so"
    with open(bad, "wb") as f:
        f.write(lib.read_bytes())
        f.truncate(20 << 30)  # sparse: a few blocks on disk, 20 GiB to any reader
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused_fast(bad, "larger than any shared library")
    start = time.monotonic()
    with pytest.raises(ElfError, match="larger than any shared library"):
        inspect(bad)  # deploy's reading: no hash or scan of 20 GiB before the refusal
    assert time.monotonic() - start < FAST_S
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 << 10  # KiB: under 64 MiB more


def test_reading_is_linear_and_fast_for_a_padded_file(lib: Path, tmp_path: Path) -> None:
    """Trailing bytes past every table (as a stripped-then-padded copy has) cost nothing per MB."""
    big = tmp_path / "padded.so"
    big.write_bytes(lib.read_bytes() + os.urandom(1 << 20) * 16)
    start = time.monotonic()
    facts = read_facts(big)
    inspect(big)
    took = time.monotonic() - start
    assert facts.soname == "libvgpu.so" and took < FAST_S * 16 / 4, took


def _libraries(built: dict[str, Path]) -> list[Path]:
    system = [Path(p) for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6",
                                "/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/libz.so.1")]
    return [built[k] for k in ("good", "glibc-2.34", "hidden-version", "vendor", "relr")] + \
        [p for p in system if p.is_file()]


def test_the_reader_agrees_with_pyelftools_on_real_libraries(built: dict[str, Path]) -> None:
    for path in _libraries(built):
        ours = read_facts(path)
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dyn = elf.get_section_by_name(".dynamic")
            tags = {t["d_tag"]: t for t in dyn.iter_tags()}
            needed = [t.needed for t in dyn.iter_tags() if t["d_tag"] == "DT_NEEDED"]
            dynsym = elf.get_section_by_name(".dynsym")
            undefined = sorted(s.name for s in dynsym.iter_symbols() if s.name and s["st_shndx"] == "SHN_UNDEF")
            defined = {s.name for s in dynsym.iter_symbols()
                       if s.name and s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] != "STB_LOCAL"}
            verneed = elf.get_section_by_name(".gnu.version_r")
            needs = sorted({a.name for _v, auxs in verneed.iter_versions() for a in auxs}) if verneed else []
        assert ours.needed == needed, path
        assert ours.soname == (tags["DT_SONAME"].soname if "DT_SONAME" in tags else None), path
        assert sorted(i.name for i in ours.imports) == undefined, path
        assert set(ours.exports) == defined, path
        assert {i.version for i in ours.imports if i.version} <= set(needs), path
        assert ours.machine == "EM_X86_64" and ours.etype == "ET_DYN"


def test_libc_floor_is_read_with_the_same_reader() -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.is_file():
        pytest.skip("no x86_64 glibc here")
    import platform

    assert glibc_floor_of_libc(libc) == platform.libc_ver()[1]
