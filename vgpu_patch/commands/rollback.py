"""`vgpu-patch rollback`: restore a recorded backup on nodes, the same atomic way, verified byte for byte."""
from __future__ import annotations

import re

import click

from ..deploy.cli_targets import default_operator, policy_from, progress, resolve_targets
from ..deploy.fleet import run_fleet, stop_requested
from ..deploy.render import plan_listing, swap_table
from ..deploy.request import DEFAULT_TOOL, SwapRequest
from ..deploy.swap import SwapResult, swap
from ..deploy.targets import HostSpec
from ..report import verbosity
from ..report.errors import UsageError
from ..transport.base import Transport
from .options import (
    dry_run_option,
    emit_json,
    fleet_options,
    json_option,
    stale_option,
    target_options,
    verbose_option,
)

EPILOG = """\b
Examples:
  vgpu-patch rollback --host admin@gpu-node-1
  vgpu-patch rollback --host admin@gpu-node-1 --to 3f2a9c01d4e5 --yes
  vgpu-patch rollback -I hosts.ini --to vendor --batch 10% --yes
  vgpu-patch rollback --local /tmp/node --yes
\b
Exit codes: 0 every node restored (or already there); 1 failed (or --dry-run with changes pending);
2 usage error (a malformed --to included, before any node is touched); 3 some nodes restored, some not.
"""


@click.command("rollback", epilog=EPILOG)
@verbose_option
@target_options
@fleet_options
@click.option("--to", "to_sha256", metavar="previous|vendor|SHA256", default="previous", show_default=True,
              help="What to restore: the file before the last swap still in effect (repeat to walk further "
                   "back: v2, v1, vendor), the file that was live before the first recorded swap, or a "
                   "backup by sha256 (6+ hex digits).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--operator", default=None, help="Who to record in the node's history [default: user@this-host].")
@stale_option
@dry_run_option
@json_option
def cli(to_sha256: str, yes: bool, operator: str | None, stale: bool, dry_run: bool, as_json: bool, parallel: int,
        **kw: object) -> None:
    """Put back the library that was live before the last swap (or the backup given by --to).

    The backup is checked against its sha256, swapped in atomically, and the live file compared
    with it byte for byte. `vgpu-patch status` lists the backups each node keeps.
    """
    if to_sha256 not in ("previous", "vendor") and not re.fullmatch(r"[0-9a-fA-F]{6,64}", to_sha256):
        raise UsageError(f"--to {to_sha256}: give previous, vendor, or at least 6 hex digits of a backup's sha256")
    targets = resolve_targets(kw)
    policy = policy_from(kw, len(targets.specs))
    if not (yes or dry_run):
        names = ", ".join(s.name for s in targets.specs[:5]) + (" ..." if len(targets.specs) > 5 else "")
        click.confirm(f"Roll back the library on {len(targets.specs)} node(s) ({names})?", abort=True, err=True)
    req = SwapRequest(operator=operator or default_operator(), action="rollback", to_sha256=to_sha256,
                      tool=DEFAULT_TOOL, stale=stale, dry_run=dry_run, should_stop=stop_requested)

    def op(t: Transport, spec: HostSpec) -> tuple[str, SwapResult]:
        r = swap(t, req.at(targets.dir_for(spec)))
        return ("changed" if r.changed else "pending" if r.pending else "unchanged"), r

    with progress(len(targets.specs), "rollback") as done:
        fleet = run_fleet(targets.specs, op, targets.connect, parallel=parallel, policy=policy, on_done=done)
    if as_json:
        emit_json({"dry_run": dry_run, **fleet.to_dict()})
    else:
        if dry_run:
            plan_listing(fleet, "vgpu-patch rollback --dry-run", commands=verbosity.level() > 0)
        else:
            swap_table(fleet, "vgpu-patch rollback")
    raise SystemExit(fleet.exit_code(dry_run=dry_run))
