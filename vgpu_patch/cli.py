"""The `vgpu-patch` command line: a thin Click layer over the library modules.

Each subcommand lives in `vgpu_patch/commands/<name>.py` and exposes a click command named `cli`.
This module only assembles them and maps the tool's errors to exit codes (see report/errors.py).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
from typing import Callable, NoReturn

import click

from .commands.options import emit_json, error_document, json_emitted, verbose_option
from .report.errors import EXIT_FAILED, VgpuPatchError

COMMANDS = ["build", "check", "deploy", "status", "rollback", "region", "agent", "daemonset", "plugin-image",
            "restart-plan", "bench", "demo"]

EPILOG = """\b
Exit codes: 0 ok; 1 failed (or --dry-run with changes pending); 2 usage error;
3 fleet partly failed; 4 check found an incompatibility; 5 status: a live file was
replaced outside vgpu-patch (the device plugin's copy-back?).
"""


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from .release.install import version_text

    click.echo(version_text())
    ctx.exit()


class LazyGroup(click.Group):
    """Imports a subcommand's module only when it is used, so `--help` and each command start fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"vgpu_patch.commands.{name.replace('-', '_')}")
        return module.cli


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version, where it was installed from (with the git commit when known), the shim's "
                   "version, and exit.")
@verbose_option
def cli() -> None:
    """Build, verify and hot-swap a fixed HAMi-compatible libvgpu.so onto GPU nodes.

    \b
    Typical session:
      vgpu-patch build -o out/
      vgpu-patch check out/libvgpu.so
      vgpu-patch deploy --host admin@gpu-node-1 out/libvgpu.so
      vgpu-patch status --host admin@gpu-node-1
      vgpu-patch rollback --host admin@gpu-node-1
    """


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def _fail(message: str, exit_code: int, argv: list[str], show: Callable[[], None] | None = None) -> NoReturn:
    """Report on stderr; with --json also one error document on stdout, unless a command printed its own."""
    if show is None:
        click.echo(f"vgpu-patch: error: {message}", err=True)
    else:
        show()
    if _wants_json(argv) and not json_emitted():
        emit_json(error_document(message, exit_code, _command(argv)))
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # Not standalone, so our errors reach the handlers below; then click returns a command's
        # ctx.exit(n) code instead of exiting, and we must pass it on.
        rv = cli.main(argv, prog_name="vgpu-patch", standalone_mode=False)
    except click.exceptions.Abort:
        _fail("aborted", EXIT_FAILED, argv, lambda: click.echo("Aborted.", err=True))
    except click.ClickException as e:  # usage errors included: bad option, missing argument
        _fail(e.format_message(), e.exit_code, argv, e.show)
    except VgpuPatchError as e:
        _fail(str(e), e.exit_code, argv)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


def run() -> NoReturn:
    """The `vgpu-patch` program: main(), then the exit handlers, then out without tearing the interpreter
    down. Freeing ansible-core's and paramiko's hundreds of modules and objects took 0.15 s of every run,
    a tenth of a small fleet's deploy; nothing is lost by skipping it (open files are flushed and closed
    by the kernel, and every handler registered with atexit still runs)."""
    try:
        main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, exit 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing more can be said
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    run()
