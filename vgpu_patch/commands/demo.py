"""`vgpu-patch demo`: the whole job on a fake local node, printing each real command as it runs."""
from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

import click

from ..report.errors import EXIT_FAILED, EXIT_OK, VgpuPatchError
from ..shim_build.standin import prepare_node
from .options import verbose_option

EPILOG = """\b
Examples:
  vgpu-patch demo                       # in a fresh temporary directory
  vgpu-patch demo --workdir /tmp/vgpu-demo
\b
Runs, in order: build, check --vendor (against the node's vendor stand-in), deploy --dry-run, deploy,
status, rollback --yes, status, all with --local NODE. NODE is a fake node root whose
/usr/local/vgpu/libvgpu.so starts as a stand-in for the vendor library. A temporary directory is removed
at the end; a --workdir is kept. Exit code: 0 when every step did what it should, else the failing
step's code.
"""


def _step(args: list[str]) -> int:
    from ..report import verbosity

    cli = click.get_current_context().find_root().command  # the `vgpu-patch` group running this demo
    if verbosity.level():  # each step is a run of its own: pass the demo's -v on, visibly
        args = ["-" + "v" * verbosity.level(), *args]
    click.secho(f"\n$ vgpu-patch {' '.join(shlex.quote(a) for a in args)}", bold=True, err=True)
    try:
        rv = cli.main(args, prog_name="vgpu-patch", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except SystemExit as e:  # commands that end with their own exit status (deploy's fleet verdict)
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else 1)
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except VgpuPatchError as e:
        click.echo(f"vgpu-patch: error: {e}", err=True)
        return e.exit_code
    return rv if isinstance(rv, int) else EXIT_OK


@click.command("demo", epilog=EPILOG)
@verbose_option
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to put out/ and node/ [default: a new temporary directory].")
@click.option("--compiler", default=None, metavar="zig|gcc|PATH", help="Passed to `build`.")
def cli(workdir: Path | None, compiler: str | None) -> None:
    """Build the shim, check it, deploy it to a fake local node, show status, roll back.

    Example: vgpu-patch demo --workdir /tmp/vgpu-demo
    """
    work = Path(workdir or tempfile.mkdtemp(prefix="vgpu-demo-")).resolve()
    try:
        _run(work, compiler)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    kept = f"files kept in {work}" if workdir else "temporary files removed (--workdir DIR keeps them)"
    click.secho(f"\ndemo finished: the node is back on the vendor stand-in; {kept}", err=True)


def _run(work: Path, compiler: str | None) -> None:
    out, node = work / "out", work / "node"
    live = prepare_node(node, compiler=compiler)
    click.echo(f"demo workdir {work}; fake node root {node}; vendor stand-in at {live}", err=True)
    lib = str(out / "libvgpu.so")
    build = ["build", "-o", str(out)] + (["--compiler", compiler] if compiler else [])
    steps = [  # each with the exit code it must give (a dry run with changes pending says so with 1)
        (build, EXIT_OK),
        (["check", lib, "--vendor", str(live)], EXIT_OK),  # the file it will replace, as on a real node
        (["deploy", "--local", str(node), "--dry-run", lib], EXIT_FAILED),
        (["deploy", "--local", str(node), lib], EXIT_OK),
        (["status", "--local", str(node)], EXIT_OK),
        (["rollback", "--local", str(node), "--yes"], EXIT_OK),
        (["status", "--local", str(node)], EXIT_OK),
    ]
    for args, want in steps:
        code = _step(args)
        if code != want:
            raise click.exceptions.Exit(code or EXIT_FAILED)
