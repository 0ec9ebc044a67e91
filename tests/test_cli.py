"""The CLI keeps its promises: every command has help with an example, exit codes are documented once."""
from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from vgpu_patch.cli import COMMANDS, cli


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Not implemented" not in result.output
    assert "vgpu-patch " + name in result.output, f"`{name} --help` shows no example invocation"


def test_top_level_help_lists_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "Exit codes" in result.output
    for name in COMMANDS:
        assert name in result.output


def test_unknown_command_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vgpu_patch.cli", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("argv", "code"), [(["--version"], 0), (["status", "--local", "/nonexistent", "--json"], 1),
                                            (["deploy"], 2)])
def test_the_program_exits_with_its_code_after_the_exit_handlers(argv: list[str], code: int) -> None:
    """run() leaves without interpreter teardown, but the exit code, the output and atexit handlers stay."""
    prog = ("import atexit, sys; atexit.register(lambda: print('handler ran', file=sys.stderr)); "
            f"sys.argv = ['vgpu-patch', *{argv!r}]; from vgpu_patch.cli import run; run()")
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.rstrip().endswith("handler ran")
    if "--json" in argv:
        assert proc.stdout.startswith("{") and proc.stdout.rstrip().endswith("}")
