"""`vgpu-patch deploy`: hot-swap a library onto nodes, safely (see docs/node-state.md)."""
from __future__ import annotations

import click

from ..deploy.candidate import inspect, verify_expected
from ..deploy.cli_targets import default_operator, policy_from, progress, resolve_targets
from ..deploy.fleet import run_fleet, stop_requested
from ..deploy.render import plan_listing, swap_table
from ..deploy.request import DEFAULT_TOOL, SwapRequest
from ..deploy.swap import SwapResult, swap
from ..deploy.targets import HostSpec
from ..release import provenance
from ..release.signing import verified
from ..report import verbosity
from ..transport.base import Transport
from .options import (
    allowed_signers_option,
    dry_run_option,
    emit_json,
    existing_path,
    fleet_options,
    json_option,
    stale_option,
    target_options,
    verbose_option,
)

EPILOG = """\b
Examples:
  vgpu-patch deploy --local /tmp/node out/libvgpu.so
  vgpu-patch deploy --host admin@gpu-node-1 out/libvgpu.so
  vgpu-patch deploy -I hosts.ini --limit 'gpu:&zone_a' --batch 1,10%,50% --max-fail 5% out/libvgpu.so
  vgpu-patch deploy --host gpu-node-1 --dry-run --json out/libvgpu.so   # the exact commands per node
  vgpu-patch deploy --allowed-signers ~/allowed_signers --host gpu-node-1 out/libvgpu.so  # signed only
\b
Exit codes: 0 every node runs FILE's sha256; 1 failed (or --dry-run with changes pending);
2 usage error (also a FILE that does not exist); 3 some nodes succeeded, some failed or were skipped.
"""


@click.command("deploy", epilog=EPILOG)
@verbose_option
@click.argument("file", type=click.Path(dir_okay=False))
@target_options
@fleet_options
@click.option("--install", is_flag=True,
              help="Install libvgpu.so where the target dir has no library yet, creating the dir (0755) if it does "
                   "not exist (it stays if the install then fails).")
@click.option("--check/--no-check", "check", default=True, show_default=True,
              help="Run `vgpu-patch check` on FILE against each node's live file (fetched once per distinct "
                   "vendor file) and refuse on a blocking problem.")
@click.option("--expect-sha256", default=None, metavar="SHA256",
              help="Refuse FILE unless its sha256 is this (FILE is also checked against its build manifest "
                   "FILE.json when one is next to it).")
@click.option("--operator", default=None, help="Who to record in the node's history [default: user@this-host].")
@allowed_signers_option
@stale_option
@dry_run_option
@json_option
def cli(file: str, install: bool, check: bool, expect_sha256: str | None, operator: str | None,
        allowed_signers: str | None, stale: bool, dry_run: bool, as_json: bool, parallel: int, **kw: object) -> None:
    """Swap FILE in as the live libvgpu.so on every target node.

    Per node, in one privileged SSH session: preflight (arch, glibc, free space, sudo, which file is
    live), upload, sha256 verified on the node, backup, atomic rename in the library directory, sha256
    verified again, history recorded. A node left mid-way still has a whole file (old or new).
    """
    existing_path("FILE", file)
    # FILE (and its .sig) read once, into a private snapshot: the sha256, the ELF check, the signature and the
    # upload all come from that copy; fails early, locally, on a file that is not a shared object
    cand = inspect(file)
    verify_expected(cand, expect_sha256)
    # before any node is reached: an unsigned, foreign-signed or changed file goes nowhere
    signature = verified(cand.path, allowed_signers, shown=cand.source) if allowed_signers else None
    signer = signature.signer if signature else None
    # the build's provenance, when beside FILE: checked like the library (and from the same snapshot), then shown
    prov = provenance.verified(cand.path, cand.sha256, allowed_signers, shown=cand.source) if allowed_signers else None
    targets = resolve_targets(kw)
    policy = policy_from(kw, len(targets.specs))
    req = SwapRequest(operator=operator or default_operator(), action="deploy", candidate=cand, tool=DEFAULT_TOOL,
                      install=install, check=check, stale=stale, dry_run=dry_run, should_stop=stop_requested,
                      signature=signature)  # once: the candidate inspected once; its signature kept on each node

    def op(t: Transport, spec: HostSpec) -> tuple[str, SwapResult]:
        r = swap(t, req.at(targets.dir_for(spec)))
        return ("changed" if r.changed else "pending" if r.pending else "unchanged"), r

    with progress(len(targets.specs), "deploy") as done:
        fleet = run_fleet(targets.specs, op, targets.connect, parallel=parallel, policy=policy, on_done=done)
    if as_json:
        emit_json({"file": str(cand.source), "sha256": cand.sha256, "dry_run": dry_run,
                   "signer": signer and signer.to_dict(), "provenance": prov and prov.to_dict(), **fleet.to_dict()})
    else:
        title = f"vgpu-patch deploy {cand.path.name} ({cand.sha256[:12]})" + (f", signed by {signer}" if signer else "")
        title += f"; {prov}" if prov else ""
        if dry_run:
            plan_listing(fleet, title + " --dry-run", commands=verbosity.level() > 0)
        else:
            swap_table(fleet, title)
    raise SystemExit(fleet.exit_code(dry_run=dry_run))
