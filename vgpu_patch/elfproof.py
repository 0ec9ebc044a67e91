"""Prove what a freshly linked shim really needs: arch, GLIBC_x.y versions, exports, stack flags.

Read from the ELF itself (pyelftools), never assumed from the compiler flags: the floor a build asks
for is only true when `.gnu.version_r` says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .errors import BuildError, ElfError

_GLIBC_RE = re.compile(r"^GLIBC_(\d+(?:\.\d+)+)$")
# Named GLIBC_ markers that stand for a release: a loader older than it refuses the library.
_NAMED_GLIBC = {"GLIBC_ABI_DT_RELR": "2.36"}


@dataclass
class ElfFacts:
    machine: str  # pyelftools e_machine, e.g. EM_X86_64
    soname: str | None
    glibc_versions: list[str] = field(default_factory=list)  # every GLIBC_* needed, e.g. GLIBC_2.2.5
    needed: list[str] = field(default_factory=list)  # DT_NEEDED
    exports: list[str] = field(default_factory=list)  # defined dynamic symbols, sorted
    exec_stack: bool = False
    build_id: str | None = None

    @property
    def max_glibc(self) -> str | None:
        """The highest glibc release any required version implies, e.g. `2.28`."""
        vs = [glibc_release(v) for v in self.glibc_versions]
        vs = [v for v in vs if v is not None]
        return max(vs, key=_vt) if vs else None


def _vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def glibc_release(version_name: str) -> str | None:
    """`GLIBC_2.2.5` -> `2.2.5`; `GLIBC_ABI_DT_RELR` -> `2.36`; GLIBC_PRIVATE or unknown -> None."""
    m = _GLIBC_RE.match(version_name)
    if m:
        return m.group(1)
    return _NAMED_GLIBC.get(version_name)


def read_facts(path: Path) -> ElfFacts:
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            facts = ElfFacts(machine=elf["e_machine"], soname=None)
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_GNU_STACK" and seg["p_flags"] & 0x1:
                    facts.exec_stack = True
            note = elf.get_section_by_name(".note.gnu.build-id")
            if note is not None:
                for n in note.iter_notes():
                    if n["n_type"] == "NT_GNU_BUILD_ID":
                        facts.build_id = n["n_desc"]
            dyn = elf.get_section_by_name(".dynamic")
            if dyn is not None:
                for tag in dyn.iter_tags():
                    if tag.entry.d_tag == "DT_SONAME":
                        facts.soname = tag.soname
                    elif tag.entry.d_tag == "DT_NEEDED":
                        facts.needed.append(tag.needed)
            vr = elf.get_section_by_name(".gnu.version_r")
            if vr is not None:
                for _verneed, auxes in vr.iter_versions():
                    for aux in auxes:
                        if aux.name.startswith("GLIBC_") and aux.name not in facts.glibc_versions:
                            facts.glibc_versions.append(aux.name)
            dynsym = elf.get_section_by_name(".dynsym")
            if dynsym is not None:
                names = set()
                for sym in dynsym.iter_symbols():
                    if (
                        sym.name
                        and sym["st_shndx"] != "SHN_UNDEF"
                        and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE")
                    ):
                        names.add(sym.name)
                facts.exports = sorted(names)
    except (ELFError, OSError, ValueError, KeyError) as e:
        raise ElfError(f"{path}: not a readable ELF shared object ({e}): rebuild it") from None
    facts.glibc_versions.sort(key=lambda v: _vt(glibc_release(v) or "0"))
    return facts


def prove(path: Path, *, machine: str, glibc: str | None, exports: list[str] | None) -> ElfFacts:
    """Raise BuildError unless `path` is for `machine`, needs no GLIBC newer than `glibc` (None: any),
    needs no GLIBC_PRIVATE, has no executable stack, and (when given) exports exactly `exports`."""
    facts = read_facts(path)
    where = f"built {path.name}"
    if facts.machine != machine:
        raise BuildError(f"{where} is {facts.machine}, expected {machine}: the compiler targets the wrong arch")
    bad = [v for v in facts.glibc_versions if glibc_release(v) is None]
    if bad:
        raise BuildError(f"{where} needs {', '.join(bad)}, which no container glibc guarantees: remove that import")
    if glibc is not None:
        too_new = [v for v in facts.glibc_versions if _vt(glibc_release(v) or "0") > _vt(glibc)]
        if too_new:
            raise BuildError(
                f"{where} needs {', '.join(too_new)} but the floor is glibc {glibc}: "
                "build with `--compiler zig` (pip install ziglang) or on a host with an older glibc"
            )
    if facts.exec_stack:
        raise BuildError(f"{where} asks for an executable stack: mark every .S file with .note.GNU-stack")
    if exports is not None and facts.exports != sorted(exports):
        missing = sorted(set(exports) - set(facts.exports))
        extra = sorted(set(facts.exports) - set(exports))
        raise BuildError(
            f"{where} exports differ from hooks.def (missing: {', '.join(missing[:8]) or 'none'}"
            f"{' ...' if len(missing) > 8 else ''}; extra: {', '.join(extra[:8]) or 'none'}"
            f"{' ...' if len(extra) > 8 else ''}): define every HOOK and keep the rest hidden"
        )
    return facts
