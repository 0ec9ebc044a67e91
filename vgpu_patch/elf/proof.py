"""Prove what a freshly linked shim really needs: arch, GLIBC_x.y versions, exports, stack flags.

Read from the ELF itself (reader.py, the reader `check` uses), never assumed from the compiler
flags: the floor a build asks for is only true when `.gnu.version_r` says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..release.install import extra_hint
from ..report.errors import BuildError
from . import facts as elf_facts
from .glibc import release_of, requirements_of, version_key


@dataclass
class ElfFacts:
    machine: str  # e_machine name, e.g. EM_X86_64
    soname: str | None
    glibc_versions: list[str] = field(default_factory=list)  # every GLIBC_* needed, e.g. GLIBC_2.2.5
    needed: list[str] = field(default_factory=list)  # DT_NEEDED
    exports: list[str] = field(default_factory=list)  # defined dynamic symbols, sorted
    exec_stack: bool = False
    build_id: str | None = None

    @property
    def max_glibc(self) -> str | None:
        """The highest glibc release any required version implies, e.g. `2.28`."""
        vs = [v for v in (glibc_release(g) for g in self.glibc_versions) if v is not None]
        return max(vs, key=version_key) if vs else None


def glibc_release(version_name: str) -> str | None:
    """`GLIBC_2.2.5` -> `2.2.5`; `GLIBC_ABI_DT_RELR` -> `2.36`; GLIBC_PRIVATE or unknown -> None."""
    return release_of(version_name)


def read_facts(path: Path) -> ElfFacts:
    """The build's view of the library, from the same ELF reader `vgpu-patch check` uses."""
    f = elf_facts.read_facts(Path(path), role="built library")
    return ElfFacts(
        machine=f.machine,
        soname=f.soname,
        glibc_versions=requirements_of(f)["versions"],
        needed=list(f.needed),
        exports=sorted(f.exports),
        exec_stack=f.stack_flags is not None and bool(f.stack_flags & 0x1),
        build_id=f.build_id,
    )


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
        too_new = [v for v in facts.glibc_versions if version_key(glibc_release(v) or "0") > version_key(glibc)]
        if too_new:
            raise BuildError(
                f"{where} needs {', '.join(too_new)} but the floor is glibc {glibc}: "
                f"build with `--compiler zig` ({extra_hint('build')}) or on a host with an older glibc"
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
