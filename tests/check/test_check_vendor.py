"""Comparing with a vendor file: its surface is the yardstick, its leaked internals are listed."""
from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_patch.elf.check import check_file
from vgpu_patch.report.errors import ElfError


def flagged(report) -> dict[str, str]:
    return {r.name: r.status for r in report.rules if r.status in ("fail", "warn")}


def test_good_against_vendor_passes_and_lists_vendor_internals(built: dict[str, Path]) -> None:
    report = check_file(built["good"], vendor=built["vendor"])
    assert flagged(report) == {}
    info = report.rule("vendor-internals")
    assert info.status == "info"
    assert set(info.items) == {"mutex", "round_up"}
    assert "449 surface names" in report.reference


def test_exporting_a_vendor_internal_fails(built: dict[str, Path]) -> None:
    report = check_file(built["extra-export"], vendor=built["vendor"])
    assert flagged(report) == {"extra-exports": "fail"}
    assert "vendor internals" in report.rule("extra-exports").detail


def test_new_needed_library_is_flagged_against_vendor(built: dict[str, Path]) -> None:
    assert flagged(check_file(built["needed"], vendor=built["vendor"])) == {"needed": "fail"}
    # the same NEEDED on both sides is no news
    assert flagged(check_file(built["needed"], vendor=built["needed"])) == {}


def test_soname_must_match_vendor(built: dict[str, Path]) -> None:
    assert flagged(check_file(built["wrong-soname"], vendor=built["vendor"])) == {"soname": "fail"}


def test_missing_vendor_surface_name(built: dict[str, Path]) -> None:
    report = check_file(built["missing"], vendor=built["vendor"])
    assert flagged(report) == {"surface-missing": "fail"}
    assert "vendor surface" in report.rule("surface-missing").detail


def test_symbol_versions_are_compared(built: dict[str, Path]) -> None:
    report = check_file(built["versioned"], vendor=built["vendor"])
    assert flagged(report) == {"symbol-versions": "warn"}
    assert "VGPU_1.0 vs none" in report.rule("symbol-versions").detail
    assert flagged(check_file(built["versioned"], vendor=built["versioned"])) == {}


def test_vendor_of_another_arch_fails_elf_machine(built: dict[str, Path], aarch64_lib: Path) -> None:
    report = check_file(built["good"], vendor=aarch64_lib)
    assert report.exit_code == 4 and report.failed() == ["elf-machine"]
    with pytest.raises(ElfError, match="but --arch asks for x86_64"):  # the vendor file itself is the wrong one
        check_file(built["good"], vendor=aarch64_lib, arch="x86_64")


def test_unreadable_vendor_is_an_error(built: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ElfError, match=r"^vendor .* does not exist"):
        check_file(built["good"], vendor=tmp_path / "nope.so")
