"""Prove from the ELF that a built shim is a safe drop-in for the vendor's libvgpu.so (issue 4).

The file is read by reader.py, whose work is bounded by the file's size.

`check_file(candidate, vendor=None, glibc="2.28", arch=None)` reads the candidate (and the vendor
file, when given; else the bundled reference surface) and returns a Report with one RuleResult per
rule: ELF class/machine/OSABI/type, SONAME, NEEDED, RPATH/RUNPATH, PT_INTERP, PT_GNU_STACK, TEXTREL,
build-id, the exported interposition surface (missing, hidden, wrong kind, extra functions, data
objects, the vendor's leaked internals, symbol versions), the GLIBC_x.y floor, GLIBC_PRIVATE and the
x86 ISA level note.

Exit status (a bitmask, as abidiff's; scripts test bits):
  0   every rule passed (warnings allowed unless --strict)
  1   tool error: file missing, unreadable, empty, a directory, not ELF, truncated, 32-bit,
      big-endian, or not the expected architecture (one line on stderr, never a traceback)
  2   usage error: bad option or value
  4   incompatible: at least one rule failed (EXIT_INCOMPATIBLE)
  8   with --strict: at least one rule warned (4|8 = 12 when both)
1 and 2 are never combined with other bits.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from ..report import verbosity
from ..report.errors import ElfError, UsageError
from .facts import ElfFacts, read_facts
from .glibc import glibc_floor_of_libc, glibc_requirements, parse_floor, requirements_of
from .reference import reference_surface
from .report import EXIT_WARNINGS, Report, RuleResult, render_table
from .rules import Context, public_exports, run_rules, split_vendor, x86_level

__all__ = [
    "EXIT_WARNINGS", "Report", "RuleResult", "check_file", "glibc_floor_of_libc", "glibc_requirements",
    "render_table",
]
SUPPORTED_ARCHES = ("x86_64", "aarch64")


def check_file(candidate: Path, *, vendor: Path | None = None, glibc: str | None = "2.28",
               arch: str | None = None, strict: bool = False, glibc_source: str | None = None) -> Report:
    """Check `candidate` against `vendor` (or the reference surface); raise ElfError on unreadable input.

    `glibc` is the floor (`"2.28"`; None for no floor); `arch` pins the expected machine (else the
    vendor's, else x86_64 or aarch64); `strict` makes warnings set exit bit 8; `glibc_source` says
    where the floor came from (a libc path) for the report.
    """
    floor = parse_floor(glibc)
    if arch is not None and arch not in SUPPORTED_ARCHES:
        raise UsageError(f"unknown --arch {arch!r}; use one of {', '.join(SUPPORTED_ARCHES)}")
    with verbosity.step("check", f"read the candidate {candidate}"):
        cand = read_facts(Path(candidate), role="candidate")
    with verbosity.step("check", f"read the vendor file {vendor}") if vendor is not None else nullcontext():
        vend = read_facts(Path(vendor), role="vendor") if vendor is not None else None
    # a candidate for another machine is checked in full: its elf-machine rule fails (exit 4), like any
    # other incompatibility; only a file that cannot be read as a supported ELF is an error (exit 1)
    want = arch or (vend.arch if vend else None)
    if vend is not None and arch and vend.arch != arch:
        raise ElfError(f"vendor {vendor} is {vend.arch}, but --arch asks for {arch}; give the {arch} vendor build")

    ref = reference_surface()
    if vend is not None:
        surface, internal = split_vendor(vend, ref.surface, ref.internal)
        internal = internal | (ref.internal - surface)
        described = f"vendor {vendor} ({len(surface)} surface names)"
    else:
        surface, internal = ref.surface, ref.internal
        described = f"the built-in reference surface ({len(surface)} names)"
    ctx = Context(cand=cand, vendor=vend, surface=surface, internal=internal, glibc_floor=floor,
                  arch=cand.arch or "", want_arch=want, want_from=f"--arch {arch}" if arch else "the vendor file")
    report = Report(
        candidate=str(candidate),
        vendor=str(vendor) if vendor is not None else None,
        arch=cand.arch,
        glibc_floor=floor,
        glibc_floor_source=glibc_source or ("--glibc" if floor else "none"),
        reference=described,
        rules=run_rules(ctx),
        facts=_facts(cand, surface),
        strict=strict,
    )
    return report


def _facts(f: ElfFacts, surface: frozenset[str]) -> dict:
    ex = public_exports(f)
    return {
        "size": f.size,
        "machine": f.machine,
        "soname": f.soname,
        "needed": f.needed,
        "rpath": f.rpath,
        "runpath": f.runpath,
        "interp": f.interp,
        "build_id": f.build_id,
        "exports": len(ex),
        "surface_exported": len(surface & ex.keys()),
        "version_defs": f.version_defs,
        "glibc": requirements_of(f),
        "x86_isa_needed": x86_level(f.x86_isa_needed) if f.arch == "x86_64" else None,
    }
