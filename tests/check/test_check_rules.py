"""Each fixture differs from the good baseline in one property; exactly one rule must catch it."""
from __future__ import annotations

from pathlib import Path

import elfcheck_fixtures as libs
import pytest

from vgpu_patch.elf.check import check_file, glibc_requirements

FLAGGED = ("fail", "warn")


def flagged(path: Path, **kw) -> dict[str, str]:
    return {r.name: r.status for r in check_file(path, **kw).rules if r.status in FLAGGED}


def test_good_baseline_passes_every_rule(built: dict[str, Path]) -> None:
    report = check_file(built["good"])
    assert flagged(built["good"]) == {}
    assert report.ok and report.exit_code == 0
    assert report.facts["surface_exported"] == 449 and report.facts["exports"] == 449
    assert {r.status for r in report.rules} <= {"pass", "info"}


@pytest.mark.parametrize("variant", [n for n, (_, rule) in libs.VARIANTS.items() if rule])
def test_one_rule_catches_each_defect(built: dict[str, Path], variant: str) -> None:
    rule = libs.VARIANTS[variant][1]
    got = flagged(built[variant])
    assert list(got) == [rule], f"{variant}: expected only {rule} to flag, got {got}"


def test_warning_only_defect_keeps_exit_zero(built: dict[str, Path]) -> None:
    report = check_file(built["no-build-id"])
    assert report.rule("build-id").status == "warn"
    assert report.ok and report.exit_code == 0
    strict = check_file(built["no-build-id"], strict=True)
    assert not strict.ok and strict.exit_code == 8


def test_fail_and_warn_combine_as_bitmask(built: dict[str, Path]) -> None:
    lib = built["execstack-no-build-id"]
    assert check_file(lib).exit_code == 4
    assert check_file(lib, strict=True).exit_code == 12


def test_details_name_the_culprits(built: dict[str, Path]) -> None:
    assert libs.PROBE in check_file(built["missing"]).rule("surface-missing").detail
    hidden = check_file(built["hidden"]).rule("surface-visibility")
    assert hidden.items == (libs.PROBE,) and "hidden" in hidden.detail
    assert check_file(built["extra-export"]).rule("extra-exports").items == ("round_up",)
    assert check_file(built["data-export"]).rule("data-exports").items == ("mutex",)
    floor = check_file(built["glibc-2.34"]).rule("glibc-floor")
    assert "GLIBC_2.34" in floor.detail and "pthread_create@GLIBC_2.34" in floor.items
    assert "_dl_argv" in check_file(built["glibc-private"]).rule("glibc-private").items
    relr = check_file(built["relr"]).rule("glibc-floor")
    assert "2.36" in relr.detail and "DT_RELR" in relr.detail
    assert "x86-64-v3" in check_file(built["x86-64-v3"]).rule("isa-level").detail
    assert "libextra.so" in check_file(built["needed"]).rule("needed").items
    assert "RUNPATH /opt/vendor/lib" in check_file(built["rpath"]).rule("rpath").detail or \
        "RPATH /opt/vendor/lib" in check_file(built["rpath"]).rule("rpath").detail


def test_glibc_floor_is_configurable(built: dict[str, Path]) -> None:
    lib = built["glibc-2.34"]
    assert check_file(lib, glibc="2.34").rule("glibc-floor").status == "pass"
    assert check_file(lib, glibc="2.17").rule("glibc-floor").status == "fail"
    assert check_file(lib, glibc=None).rule("glibc-floor").status == "info"


def test_glibc_requirements(built: dict[str, Path]) -> None:
    req = glibc_requirements(built["glibc-2.34"])
    assert req["max_version"] == "2.34"
    assert req["glibc_private"] is False
    assert "GLIBC_2.34" in req["versions"] and "pthread_create" in req["symbols"]["GLIBC_2.34"]
    assert glibc_requirements(built["glibc-private"])["glibc_private"] is True
    assert glibc_requirements(built["good"])["max_version"] is None


def test_versioned_surface_is_bindable(built: dict[str, Path]) -> None:
    report = check_file(built["versioned"])
    assert flagged(built["versioned"]) == {}
    assert "VGPU_1.0" in report.rule("symbol-versions").detail
    assert report.facts["version_defs"] == ["VGPU_1.0"]


def test_aarch64_build_passes_with_its_arch(aarch64_lib: Path) -> None:
    report = check_file(aarch64_lib, arch="aarch64")
    assert report.arch == "aarch64"
    assert flagged(aarch64_lib, arch="aarch64") == {}, report.rules
    assert report.rule("isa-level").status == "pass"


def test_statuses_of_secondary_defects(built: dict[str, Path]) -> None:
    assert flagged(built["weak"]) == {"surface-kind": "warn"}
    assert flagged(built["protected"]) == {"surface-visibility": "warn"}
    assert flagged(built["surface-object"]) == {"surface-kind": "fail"}
    assert flagged(built["hidden-version"]) == {"symbol-versions": "fail"}


def test_missing_gnu_stack_means_executable_stack(built: dict[str, Path], tmp_path: Path) -> None:
    from elftools.elf.elffile import ELFFile

    data = bytearray(built["good"].read_bytes())
    with open(built["good"], "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, seg in enumerate(elf.iter_segments()) if seg["p_type"] == "PT_GNU_STACK")
        offset = elf["e_phoff"] + index * elf["e_phentsize"]
    data[offset:offset + 4] = (0).to_bytes(4, "little")  # PT_GNU_STACK -> PT_NULL
    lib = tmp_path / "nostack.so"
    lib.write_bytes(bytes(data))
    report = check_file(lib)
    assert flagged(lib) == {"exec-stack": "fail"}
    assert "no PT_GNU_STACK" in report.rule("exec-stack").detail


def test_object_file_is_not_a_shared_object(built: dict[str, Path]) -> None:
    report = check_file(built["good"].parent / "probe.o")
    assert report.rule("elf-type").status == "fail" and "ET_REL" in report.rule("elf-type").detail
