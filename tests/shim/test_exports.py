"""The built shim exports exactly the vendor's [surface] (449 functions) and nothing else."""
from __future__ import annotations

from pathlib import Path

from elftools.elf.elffile import ELFFile

from vgpu_patch.elf.reference import reference_surface
from vgpu_patch.shim_build.surface import exported_names, parse_hooks, wrapped_variants


def dynamic_exports(path: Path) -> list[tuple[str, str]]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        return [(s.name, s["st_info"]["type"]) for s in dynsym.iter_symbols()
                if s.name and s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")]


def test_hooks_def_is_the_reference_surface() -> None:
    surface = reference_surface().surface
    assert len(surface) == 449
    assert set(exported_names()) == surface
    assert len(exported_names()) == len(set(exported_names()))
    assert {h.kind for h in parse_hooks()} == {"PASS", "OWN", "STUB"}
    assert {h.lib for h in parse_hooks()} == {"CUDA", "NVML", "LIBC"}
    own = {h.name for h in parse_hooks() if h.kind == "OWN"}
    variants = wrapped_variants()
    assert set(variants.values()) <= own and not set(variants) & own
    ptsz = {v for v in variants if v.endswith("_ptsz")}
    assert len(ptsz) == 8 and all(v == variants[v] + "_ptsz" for v in ptsz)
    # the older ABIs a CUDA 11 runtime or an old program can still reach
    assert {"cuGetProcAddress", "cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem",
            "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3"} <= set(variants) | own
    # NVML's listings newer than the vendor's surface: handed out by dlsym, never exported (issue 35)
    assert {f"nvmlDeviceGet{k}RunningProcesses_v3" for k in ("Compute", "Graphics", "MPSCompute")} <= set(variants)


def test_exported_set_equals_surface_exactly(shim_path: Path) -> None:
    exports = dynamic_exports(shim_path)
    names = [n for n, _ in exports]
    assert len(names) == len(set(names))
    assert set(names) == reference_surface().surface
    assert {t for _, t in exports} == {"STT_FUNC"}, "no data objects may be exported"
    assert not set(names) & reference_surface().internal
    assert not set(names) & set(wrapped_variants())


def test_ident_string_embedded(shim_path: Path) -> None:
    from vgpu_patch import __version__
    assert f"vgpu-patch-shim {__version__}".encode() in shim_path.read_bytes()


def test_no_private_glibc_imports(shim_path: Path) -> None:
    with shim_path.open("rb") as f:
        elf = ELFFile(f)
        undefined = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols() if s["st_shndx"] == "SHN_UNDEF"}
        verneed = elf.get_section_by_name(".gnu.version_r")
        versions = {aux.name for _, auxes in verneed.iter_versions() for aux in auxes} if verneed else set()
    assert "dlvsym" in undefined  # the real dlsym comes from a versioned public lookup
    assert not {"_dl_sym", "_dl_vsym", "__libc_dlsym"} & undefined
    assert "GLIBC_PRIVATE" not in versions
