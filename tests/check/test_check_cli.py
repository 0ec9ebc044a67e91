"""`vgpu-patch check` through click: the table, the --json schema and the exit-status bitmask."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from elfcheck_fixtures import cli_runner

from vgpu_patch.cli import cli as top
from vgpu_patch.commands.check import cli
from vgpu_patch.elf.check import check_file

REPO = Path(__file__).resolve().parents[2]
RULE_KEYS = {"name", "status", "detail", "items"}
DOC_KEYS = {"schema", "candidate", "vendor", "reference", "arch", "glibc_floor", "glibc_floor_source", "strict",
            "ok", "exit_code", "summary", "rules", "facts"}


def run(*args: str):
    return cli_runner().invoke(cli, [str(a) for a in args])


def test_table_has_one_line_per_rule(built: dict[str, Path]) -> None:
    result = run(built["execstack"])
    assert result.exit_code == 4
    report = check_file(built["execstack"])
    lines = result.stdout.splitlines()
    for r in report.rules:
        assert sum(1 for ln in lines if ln.startswith(r.name + " ")) == 1, r.name
    assert any(ln.split()[:2] == ["exec-stack", "fail"] for ln in lines)
    assert "INCOMPATIBLE" in lines[-1] and "\x1b[" not in result.stdout  # no colour off a terminal


def test_json_schema(built: dict[str, Path]) -> None:
    result = run(built["glibc-2.34"], "--json")
    assert result.exit_code == 4
    doc = json.loads(result.stdout)  # exactly one document
    assert set(doc) == DOC_KEYS
    assert doc["schema"] == "vgpu-patch/check/1" and doc["ok"] is False and doc["exit_code"] == 4
    assert doc["arch"] == "x86_64" and doc["glibc_floor"] == "2.28" and doc["vendor"] is None
    assert all(set(r) == RULE_KEYS and r["status"] in ("pass", "warn", "fail", "info") for r in doc["rules"])
    assert sum(doc["summary"].values()) == len(doc["rules"])
    assert [r["name"] for r in doc["rules"] if r["status"] == "fail"] == ["glibc-floor"]
    assert doc["facts"]["glibc"]["max_version"] == "2.34"
    assert doc["facts"]["soname"] == "libvgpu.so"


@pytest.mark.parametrize("variant,args,code", [
    ("good", [], 0),
    ("execstack", [], 4),
    ("no-build-id", [], 0),
    ("no-build-id", ["--strict"], 8),
    ("execstack-no-build-id", ["--strict"], 12),
    ("glibc-2.34", ["--glibc", "2.34"], 0),
    ("glibc-2.34", ["--glibc", "none"], 0),
    ("good", ["--vendor", "{vendor}"], 0),
    ("good", ["--arch", "x86_64"], 0),
])
def test_exit_status(built: dict[str, Path], variant: str, args: list[str], code: int) -> None:
    args = [a.format(vendor=built["vendor"]) for a in args]
    result = run(built[variant], *args, "--json")
    assert result.exit_code == code, result.stdout
    assert json.loads(result.stdout)["exit_code"] == code


@pytest.mark.parametrize("args", [
    ["--glibc", "two"],
    ["--arch", "sparc"],
    ["--glibc", "2.28", "--glibc-from", "/lib"],
    ["--glibc-from", "/lib", "--glibc-from-image", "/lib"],
    ["--no-such-option"],
])
def test_usage_errors_exit_2(built: dict[str, Path], args: list[str]) -> None:
    result = run(built["good"], *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_reachable_from_the_top_level_group(built: dict[str, Path]) -> None:
    result = cli_runner().invoke(top, ["check", str(built["good"])])
    assert result.exit_code == 0, result.output
    help_text = cli_runner().invoke(top, ["check", "--help"]).stdout
    assert "vgpu-patch check out/libvgpu.so" in help_text and "Exit status" in help_text


def test_real_subprocess(built: dict[str, Path], tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "vgpu_patch.cli", "check"]
    proc = subprocess.run(cmd + [str(built["extra-export"]), "--json"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["rules"][[r["name"] for r in doc["rules"]].index("extra-exports")]["items"] == ["round_up"]
    assert "Traceback" not in proc.stderr
    bad = tmp_path / "trunc.so"
    bad.write_bytes(built["good"].read_bytes()[:1000])
    proc = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "truncated" in proc.stderr and "Traceback" not in proc.stderr
