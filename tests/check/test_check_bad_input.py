"""Bad input gets one clear line and exit 1, never a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest
from elfcheck_fixtures import cli_runner

from vgpu_patch.commands.check import cli
from vgpu_patch.elf.check import check_file
from vgpu_patch.report.errors import ElfError


def _make(kind: str, built: dict[str, Path], tmp: Path, request: pytest.FixtureRequest) -> tuple[Path, list[str]]:
    good = built["good"].read_bytes()
    path = tmp / f"{kind}.so"
    extra: list[str] = []
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "truncated-header":
        path.write_bytes(good[:40])
    elif kind == "truncated-tail":
        path.write_bytes(good[:-1])
    elif kind == "not-elf":
        path.write_text("#!/bin/sh\necho this is not a library\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "32-bit":
        path = request.getfixturevalue("i386_lib")
    elif kind == "no-section-headers":
        data = bytearray(good)
        data[0x28:0x30] = bytes(8)  # e_shoff
        data[0x3C:0x40] = bytes(4)  # e_shnum, e_shstrndx
        path.write_bytes(bytes(data))
    elif kind == "device":
        path = Path("/dev/null")
    elif kind == "proc-file":
        path = Path("/proc/self/maps")
    elif kind == "riscv":
        import elfcheck_fixtures as libs

        if not libs.zig_available():
            pytest.skip("ziglang is needed to cross-build a riscv64 fixture")
        (tmp / "tiny.c").write_text("int cuInit(void) { return 0; }\n")
        path = libs.zig_build(tmp, "riscv", "riscv64-linux-gnu", source="tiny.c")
    elif kind == "corrupt-sections":
        data = bytearray(good)
        data[0x28:0x30] = (len(good) * 4).to_bytes(8, "little")  # e_shoff far past the end
        path.write_bytes(bytes(data))
    return path, extra


CASES = {
    "truncated": "truncated",
    "truncated-header": "truncated",
    "truncated-tail": "truncated",
    "not-elf": "not an ELF file",
    "empty": "is empty",
    "directory": "is a directory",
    "missing": "does not exist",
    "32-bit": "32-bit",
    "corrupt-sections": "truncated",
    "device": "not a regular file",
    "proc-file": "cannot be read to its end",
    "no-section-headers": "no section headers",
    "riscv": "RISC-V",
}


@pytest.mark.parametrize("kind", list(CASES))
def test_bad_input_is_one_line_exit_1(kind: str, built: dict[str, Path], tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    path, extra = _make(kind, built, tmp_path, request)
    result = cli_runner().invoke(cli, [str(path), *extra])
    # a path that does not exist is a usage error, as in every command (docs/cli-reference.md#exit-codes)
    assert result.exit_code == (2 if kind == "missing" else 1), (result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpu-patch: error: "), result.stderr
    assert CASES[kind] in lines[0] and str(path) in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    with pytest.raises(ElfError):
        check_file(path)


def test_bad_input_with_json_still_prints_one_document(built: dict[str, Path], tmp_path: Path) -> None:
    import json

    path = tmp_path / "x.so"
    path.write_text("nope")
    result = cli_runner().invoke(cli, [str(path), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 1 and "not an ELF file" in doc["error"]


@pytest.mark.parametrize("against", ["vendor", "--arch"])
def test_a_build_for_another_machine_is_an_incompatibility_exit_4(against: str, built: dict[str, Path],
                                                                  aarch64_lib: Path) -> None:
    """An aarch64 build checked against an x86_64 vendor file (or --arch x86_64) is readable: the whole table
    is printed, elf-machine fails and says how to fix it, and the exit status is 4 (incompatible), not 1."""
    extra = ["--vendor", str(built["good"])] if against == "vendor" else ["--arch", "x86_64"]
    result = cli_runner().invoke(cli, [str(aarch64_lib), *extra])
    assert result.exit_code == 4, (result.stdout, result.stderr)
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in result.stdout.splitlines()
            if line[:1].islower() and len(line.split()) > 2}
    whose = "the vendor file" if against == "vendor" else "--arch x86_64"
    assert rows["elf-machine"] == ["fail", f"EM_AARCH64 (aarch64), but {whose} is x86_64: it cannot be loaded "
                                           "there; build with --arch x86_64"], result.stdout
    assert "surface-missing" in rows and "glibc-floor" in rows
    assert result.stdout.rstrip().splitlines()[-1].startswith("INCOMPATIBLE: 1 failed, ") and result.stderr == ""
