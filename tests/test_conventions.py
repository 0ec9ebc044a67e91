"""CLI conventions every command keeps: a `schema` key in each --json document (an error document
too, even for a usage error), NO_COLOR, status failing on a node with no library, and help text
that agrees with the defaults it describes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_patch.commands.options import use_color

ROOT = Path(__file__).resolve().parent.parent


def vgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.parametrize("argv", [
    ["status", "--no-such-option", "--json"],
    ["check", "--json"],  # missing argument
    ["deploy", "--local", "/nonexistent", "--json", "/nonexistent/libvgpu.so"],
    ["rollback", "--json", "--yes"],  # no target
    ["deploy", "--json"],
])
def test_json_failures_print_one_error_document(argv: list[str]) -> None:
    p = vgpu(*argv)
    assert p.returncode in (1, 2), p
    doc = json.loads(p.stdout)  # exactly one document, whatever failed
    assert doc["schema"].startswith("vgpu-patch/") and doc["ok"] is False and doc["exit_code"] == p.returncode
    assert doc["error"] and "Traceback" not in p.stderr


def test_a_usage_error_with_json_is_exit_2_with_the_error_schema() -> None:
    p = vgpu("status", "--no-such-option", "--json")
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["schema"] == "vgpu-patch/error/1" and doc["command"] == "status" and "--no-such-option" in doc["error"]


def test_status_of_a_node_without_a_library_exits_1_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "usr" / "local" / "vgpu").mkdir(parents=True)
    p = vgpu("status", "--local", str(tmp_path), "--json")
    assert p.returncode == 1, p
    doc = json.loads(p.stdout)
    assert doc["schema"] == "vgpu-patch/status/1" and doc["counts"] == {"missing": 1}
    assert "no libvgpu.so" in doc["nodes"][0]["result"]["problem"]


def test_a_kubernetes_document_names_its_schema_with_apiversion_and_kind() -> None:
    doc = json.loads(vgpu("daemonset", "--json").stdout)  # kubectl refuses unknown top-level fields
    assert doc["apiVersion"] == "apps/v1" and doc["kind"] == "DaemonSet" and "schema" not in doc


def test_a_region_failure_document_carries_a_schema(tmp_path: Path) -> None:
    p = vgpu("region", "--json", str(tmp_path / "missing.cache"))
    assert json.loads(p.stdout)["schema"].startswith("vgpu-patch/"), p


class _Tty:
    def isatty(self) -> bool:
        return True


def test_no_color_turns_colour_off_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(_Tty())  # type: ignore[arg-type]
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(_Tty())  # type: ignore[arg-type]


def test_check_output_has_no_escape_codes_under_no_color(tmp_path: Path) -> None:
    lib = tmp_path / "x.so"
    lib.write_text("not a library")
    p = vgpu("check", str(lib), env={"NO_COLOR": "1"})
    assert "\x1b[" not in p.stdout + p.stderr


def test_agent_help_uses_the_daemonset_default_namespace() -> None:
    from vgpu_patch.k8s.daemonset import DaemonSetOptions

    ns = DaemonSetOptions.__dataclass_fields__["namespace"].default
    help_text = vgpu("agent", "--help").stdout
    assert f"kubectl -n {ns} " in help_text
