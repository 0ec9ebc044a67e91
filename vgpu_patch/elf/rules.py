"""The drop-in rules: each compares the candidate's ELF facts with the vendor's (or the reference).

A rule returns one RuleResult; `fail` means preloading the file can break or hijack programs,
`warn` means unusual but harmless for loading, `info` reports without judging.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

from .facts import PF_X, DynSymbol, ElfFacts
from .glibc import release_of, requirements_of, version_key
from .report import RuleResult

REFERENCE_SONAME = "libvgpu.so"
# Libraries of glibc itself: present in every container the shim can load in.
_GLIBC_LIBS = re.compile(r"^(libc\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libm\.so\.6"
                         r"|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$")
# SONAMEs that would make the loader believe a real driver or system library is already loaded.
_SYSTEM_SONAME = re.compile(r"^(libcuda|libnvidia-ml|libcudart|libc|libdl|libpthread|ld-linux)[.-]")
_ENTRY_POINT = re.compile(r"^(cu[A-Z]\w*|nvml[A-Z]\w*|dlsym|dlvsym)$")
_LINKER_MARKERS = frozenset({"_init", "_fini", "_edata", "_end", "__bss_start", "_DYNAMIC",
                             "_GLOBAL_OFFSET_TABLE_", "__end__", "_etext", "etext", "edata", "end"})
_FUNC_TYPES = ("STT_FUNC", "STT_GNU_IFUNC")
_DATA_TYPES = ("STT_OBJECT", "STT_TLS", "STT_COMMON")
# GNU_PROPERTY_X86_ISA_1_* bits, highest first.
_X86_LEVELS = ((8, "x86-64-v4"), (4, "x86-64-v3"), (2, "x86-64-v2"), (1, "x86-64 baseline"))
_OK_OSABI = ("ELFOSABI_SYSV", "ELFOSABI_LINUX")


@dataclass
class Context:
    cand: ElfFacts
    vendor: ElfFacts | None
    surface: frozenset[str]  # names the candidate must export as functions
    internal: frozenset[str]  # the vendor's leaked helpers (must not be exported)
    glibc_floor: str | None
    arch: str
    want_arch: str | None = None  # the machine asked for: --arch, else the vendor file's
    want_from: str = ""  # who asks: "--arch aarch64" or "the vendor file"

    @property
    def ref(self) -> str:
        return "vendor" if self.vendor else "reference"


def listing(names: Iterable[str], limit: int = 6) -> str:
    """`a, b, c (+4 more)` for a one-line detail; the full list goes to RuleResult.items."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def public_exports(facts: ElfFacts) -> dict[str, DynSymbol]:
    """Defined dynamic symbols, less linker markers and version-node symbols."""
    return {n: s for n, s in facts.exports.items()
            if not (n in _LINKER_MARKERS or (s.absolute and n in facts.version_defs))}


def split_vendor(vendor: ElfFacts, reference_surface: frozenset[str], reference_internal: frozenset[str]
                 ) -> tuple[frozenset[str], frozenset[str]]:
    """The vendor file's (surface, leaked internals): entry-point functions vs everything else."""
    surface: set[str] = set()
    internal: set[str] = set()
    for name, sym in public_exports(vendor).items():
        is_entry = name in reference_surface or (_ENTRY_POINT.match(name) and name not in reference_internal)
        (surface if is_entry and sym.type in _FUNC_TYPES else internal).add(name)
    return frozenset(surface), frozenset(internal)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def is_glibc_lib(name: str) -> bool:
    return bool(_GLIBC_LIBS.match(name))


def x86_level(bits: int | None) -> str:
    for bit, name in _X86_LEVELS:
        if bits and bits & bit:
            return name
    return "x86-64 baseline"


# --- ELF header and dynamic section -------------------------------------------------------------


def elf_class(c: Context) -> RuleResult:
    return RuleResult("elf-class", "pass", "ELFCLASS64, little-endian")


def elf_machine(c: Context) -> RuleResult:
    if c.want_arch and c.arch != c.want_arch:
        return RuleResult("elf-machine", "fail",
                          f"{c.cand.machine} ({c.arch}), but {c.want_from} is {c.want_arch}: it cannot be loaded "
                          f"there; build with --arch {c.want_arch}", (c.arch,))
    same = ", same as the vendor's" if c.vendor else ""
    return RuleResult("elf-machine", "pass", f"{c.cand.machine} ({c.arch}){same}")


def elf_osabi(c: Context) -> RuleResult:
    if c.cand.osabi in _OK_OSABI:
        return RuleResult("elf-osabi", "pass", c.cand.osabi)
    return RuleResult("elf-osabi", "fail", f"{c.cand.osabi}: glibc loads only SYSV/GNU objects; rebuild for Linux")


def elf_type(c: Context) -> RuleResult:
    if c.cand.etype == "ET_DYN":
        return RuleResult("elf-type", "pass", "ET_DYN (shared object)")
    return RuleResult("elf-type", "fail", f"{c.cand.etype}: not a shared object; link it with -shared")


def soname(c: Context) -> RuleResult:
    got = c.cand.soname
    if c.vendor and c.vendor.soname:
        want = c.vendor.soname
        ok = got == want
    else:
        want = REFERENCE_SONAME
        ok = got is not None and (got == want or got.startswith(want + "."))
    if ok:
        return RuleResult("soname", "pass", f"{got}")
    if got is None:
        return RuleResult("soname", "warn", f"no SONAME (the vendor's is {want}); link with -Wl,-soname,{want}")
    why = " and would shadow a real library in the loader" if _SYSTEM_SONAME.match(got) else ""
    return RuleResult("soname", "fail", f"{got} differs from {want}{why}; link with -Wl,-soname,{want}", (got,))


def needed(c: Context) -> RuleResult:
    have = c.cand.needed
    base = set(c.vendor.needed) if c.vendor else set()
    new = [n for n in have if n not in base and not is_glibc_lib(n)]
    if new:
        where = "the vendor's" if c.vendor else "glibc's own libraries"
        return RuleResult("needed", "fail", f"needs {listing(new)}, beyond {where}: containers without it "
                          "cannot start any program; drop the dependency or dlopen it", tuple(new))
    extra = [n for n in have if n not in base] if c.vendor else []
    note = f" (adds glibc's {listing(extra)})" if extra else ""
    return RuleResult("needed", "pass", (listing(have) or "no libraries") + note, tuple(have))


def search_path(c: Context) -> RuleResult:
    paths = [f"RPATH {p}" for p in c.cand.rpath] + [f"RUNPATH {p}" for p in c.cand.runpath]
    if paths:
        return RuleResult("rpath", "fail", f"{listing(paths)}: a preloaded library must not steer library "
                          "lookups; relink without -Wl,-rpath", tuple(paths))
    return RuleResult("rpath", "pass", "no RPATH or RUNPATH")


def interpreter(c: Context) -> RuleResult:
    if c.cand.interp:
        return RuleResult("interp", "fail", f"PT_INTERP {c.cand.interp}: a library has no interpreter; "
                          "remove the .interp section / -pie link", (c.cand.interp,))
    return RuleResult("interp", "pass", "no PT_INTERP")


def exec_stack(c: Context) -> RuleResult:
    flags = c.cand.stack_flags
    if flags is None:
        return RuleResult("exec-stack", "fail", "no PT_GNU_STACK: the loader makes every thread stack executable; "
                          "link with -Wl,-z,noexecstack")
    if flags & PF_X:
        return RuleResult("exec-stack", "fail", "PT_GNU_STACK is RWX: loading it makes the stack executable "
                          "(or fails on hardened glibc); link with -Wl,-z,noexecstack")
    return RuleResult("exec-stack", "pass", "PT_GNU_STACK RW (non-executable)")


def textrel(c: Context) -> RuleResult:
    if c.cand.textrel:
        return RuleResult("textrel", "fail", "TEXTREL: code is patched at load time (blocked by SELinux, "
                          "unshared pages); compile every object with -fPIC")
    return RuleResult("textrel", "pass", "no text relocations")


def build_id(c: Context) -> RuleResult:
    if c.cand.build_id:
        return RuleResult("build-id", "pass", f"GNU build-id {c.cand.build_id}")
    return RuleResult("build-id", "warn", "no GNU build-id: crash dumps cannot be matched to this build; "
                      "link with -Wl,--build-id")


# --- the exported interposition surface ---------------------------------------------------------


def surface_missing(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    missing = sorted(c.surface - ex.keys())
    absent = sorted(set(missing) - c.cand.symtab_definitions(missing).keys())
    if absent:
        return RuleResult("surface-missing", "fail", f"{len(absent)} of {len(c.surface)} {c.ref} surface names "
                          f"are not defined: {listing(absent)}; add them to hooks.def (HOOK lines)", tuple(absent))
    return RuleResult("surface-missing", "pass", f"all {len(c.surface)} {c.ref} surface names are defined")


def surface_visibility(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    missing = sorted(c.surface - ex.keys())
    hidden = c.cand.symtab_definitions(missing)
    if hidden:
        names = sorted(hidden)
        # ld turns hidden symbols into plain locals, so hidden visibility and a version script's
        # `local: *` look the same in .symtab.
        return RuleResult("surface-visibility", "fail", f"{plural(len(names), 'surface name')} defined but local "
                          f"(hidden visibility or outside the version script): {listing(names)}; export them "
                          "with default visibility", tuple(names))
    odd = sorted(n for n in c.surface & ex.keys() if ex[n].visibility != "STV_DEFAULT")
    if odd:
        return RuleResult("surface-visibility", "warn", f"exported with {ex[odd[0]].visibility}: {listing(odd)}; "
                          "interposers use default visibility", tuple(odd))
    return RuleResult("surface-visibility", "pass", "every exported surface name has default visibility")


def surface_kind(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    present = sorted(c.surface & ex.keys())
    not_func = [n for n in present if ex[n].type not in _FUNC_TYPES]
    if not_func:
        kinds = sorted({ex[n].type for n in not_func})
        return RuleResult("surface-kind", "fail", f"not functions ({', '.join(kinds)}): {listing(not_func)}; "
                          "define them as functions", tuple(not_func))
    weak = [n for n in present if ex[n].bind != "STB_GLOBAL"]
    if weak:
        return RuleResult("surface-kind", "warn", f"not STB_GLOBAL ({ex[weak[0]].bind}): {listing(weak)}; "
                          "define them as strong globals", tuple(weak))
    return RuleResult("surface-kind", "pass", f"all {len(present)} exported surface names are global functions")


def extra_exports(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    extras = sorted(n for n in ex.keys() - c.surface if ex[n].type not in _DATA_TYPES)
    known = [n for n in extras if n in c.internal]
    entry = [n for n in extras if n not in c.internal and _ENTRY_POINT.match(n)]
    other = [n for n in extras if n not in c.internal and not _ENTRY_POINT.match(n)]
    hijack = known + other
    if hijack:
        tag = f" ({len(known)} of them vendor internals)" if known else ""
        return RuleResult("extra-exports", "fail",
                          f"exports {plural(len(hijack), 'function')} outside the surface{tag}: "
                          f"{listing(hijack)}; they hijack same-named application symbols: make them hidden",
                          tuple(hijack + entry))
    if entry:
        return RuleResult("extra-exports", "warn",
                          f"exports {plural(len(entry), 'driver entry point')} not in the {c.ref} "
                          f"surface: {listing(entry)}; they interpose real driver calls", tuple(entry))
    return RuleResult("extra-exports", "pass", "no functions exported beyond the surface")


def data_exports(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    data = sorted(n for n in ex.keys() - c.surface if ex[n].type in _DATA_TYPES)
    if data:
        return RuleResult("data-exports", "fail", f"exports {plural(len(data), 'data object')}: {listing(data)}; they "
                          "take over same-named application globals: make them static or hidden", tuple(data))
    return RuleResult("data-exports", "pass", "no data objects exported")


def vendor_internals(c: Context) -> RuleResult:
    if c.vendor:
        leakers = sorted(public_exports(c.vendor).keys() - c.surface)
        who = "the vendor file leaks"
    else:
        leakers = sorted(c.internal)
        who = "the vendor build leaks"
    leaked = sorted(set(leakers) & public_exports(c.cand).keys())
    detail = f"{who} {len(leakers)} internal symbols" + (f" (e.g. {', '.join(leakers[:3])})" if leakers else "")
    detail += f"; this build exports {len(leaked)} of them" + (f": {listing(leaked)}" if leaked else "")
    return RuleResult("vendor-internals", "info", detail, tuple(leakers))


def symbol_versions(c: Context) -> RuleResult:
    ex = public_exports(c.cand)
    present = sorted(c.surface & ex.keys())
    hidden = [n for n in present if ex[n].hidden_version]
    if hidden:
        return RuleResult("symbol-versions", "fail", f"defined only as name@VERSION (non-default): {listing(hidden)}; "
                          "unversioned references cannot bind to them: use @@ or no version", tuple(hidden))
    mine = sorted({ex[n].version or "unversioned" for n in present})
    if c.vendor:
        theirs = c.vendor.exports
        diff = [n for n in present if n in theirs and ex[n].version != theirs[n].version]
        if diff:
            n = diff[0]
            return RuleResult("symbol-versions", "warn", f"{plural(len(diff), 'surface name')} versioned unlike the "
                              f"vendor's (e.g. {n}: {ex[n].version or 'none'} vs {theirs[n].version or 'none'}); "
                              "match its version script", tuple(diff))
        return RuleResult("symbol-versions", "pass", f"same as the vendor's ({', '.join(mine) or 'none'})")
    return RuleResult("symbol-versions", "pass", f"surface is {', '.join(mine) or 'empty'}; all bindable by name")


# --- target compatibility -----------------------------------------------------------------------


def glibc_floor(c: Context) -> RuleResult:
    req = requirements_of(c.cand)
    top = req["max_version"]
    vend = ""
    if c.vendor:
        vend = f" (vendor needs {requirements_of(c.vendor)['max_version'] or 'none'})"
    if c.glibc_floor is None:
        return RuleResult("glibc-floor", "info", f"needs glibc {top or 'of any version'}; no floor given{vend}")
    floor = version_key(c.glibc_floor)
    above = [v for v in req["versions"] if (rel := release_of(v)) and version_key(rel) > floor]
    if above:
        syms = [s for v in above for s in req["symbols"][v]]
        return RuleResult("glibc-floor", "fail", f"needs GLIBC_{top} ({listing(syms, 4)}) > floor {c.glibc_floor}: "
                          f"no program starts where glibc is older; rebuild with --glibc {c.glibc_floor}{vend}",
                          tuple(f"{s}@{v}" for v in above for s in req["symbols"][v]))
    if req["unknown"]:
        return RuleResult("glibc-floor", "warn", f"needs unknown glibc markers {listing(req['unknown'])}; "
                          "cannot tell their release", tuple(req["unknown"]))
    return RuleResult("glibc-floor", "pass", f"needs GLIBC_{top} <= floor {c.glibc_floor}{vend}" if top
                      else f"needs no versioned glibc symbol{vend}")


def glibc_private(c: Context) -> RuleResult:
    syms = requirements_of(c.cand)["symbols"].get("GLIBC_PRIVATE", [])
    if syms:
        return RuleResult("glibc-private", "fail", f"imports GLIBC_PRIVATE {listing(syms)}: private to one glibc "
                          "build, breaks on any other; stop using them", tuple(syms))
    return RuleResult("glibc-private", "pass", "no GLIBC_PRIVATE imports")


def isa_level(c: Context) -> RuleResult:
    if c.arch != "x86_64":
        return RuleResult("isa-level", "pass", f"no x86 ISA level applies to {c.arch}")
    bits = c.cand.x86_isa_needed or 0
    allowed = (c.vendor.x86_isa_needed or 0) if c.vendor else 0
    level = x86_level(bits)
    if bits & ~allowed & ~1:  # any level above baseline that the vendor does not need too
        return RuleResult("isa-level", "fail", f"needs {level} (GNU property note): it fails on older CPUs; "
                          "rebuild without -march=x86-64-v2/v3/v4", (level,))
    source = "GNU property note" if c.cand.x86_isa_needed is not None else "no ISA property note"
    return RuleResult("isa-level", "pass", f"{level} ({source})")


RULES: list[Callable[[Context], RuleResult]] = [
    elf_class, elf_machine, elf_osabi, elf_type, soname, needed, search_path, interpreter, exec_stack,
    textrel, build_id, surface_missing, surface_visibility, surface_kind, extra_exports, data_exports,
    vendor_internals, symbol_versions, glibc_floor, glibc_private, isa_level,
]


def run_rules(c: Context) -> list[RuleResult]:
    return [rule(c) for rule in RULES]
