"""`vgpu-patch status`: what each node runs, its backups and history, and who still maps an old copy."""
from __future__ import annotations

import click

from ..deploy.cli_targets import progress, resolve_targets
from ..deploy.fleet import run_fleet
from ..deploy.render import status_table
from ..deploy.swap import NodeStatus, node_status
from ..deploy.targets import HostSpec
from ..report.errors import EXIT_OK, EXIT_REPLACED, DeployError
from ..transport.base import Transport
from .options import emit_json, json_option, target_options, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch status --host admin@gpu-node-1
  vgpu-patch status -I hosts.ini --limit gpu --json
  vgpu-patch status --local /tmp/node
\b
Exit codes: 0 every node answered and has a library; 1 none did; 2 usage error;
3 some did not; 5 every node answered, but on some the live file was replaced outside
vgpu-patch (the device plugin's copy-back?: it differs from the last recorded change). A
node without a libvgpu.so (or with an ambiguous one), or whose state directory is refused
(a symlink, or not root's alone), counts as not done.
"""


@click.command("status", epilog=EPILOG)
@verbose_option
@target_options
@click.option("--history", "history", default=5, show_default=True, type=click.IntRange(0),
              help="How many history entries to show per node.")
@json_option
def cli(history: int, as_json: bool, parallel: int, **kw: object) -> None:
    """Show per node: the live library and its sha256, ours (with version) or the vendor's,
    the backups kept, the last swaps, and how many running processes still map an older copy
    (they keep it until restarted), each with its pod UID and container id read from /proc/PID/cgroup.
    """
    targets = resolve_targets(kw)

    from ..k8s.procmap import stale_table, with_pods

    def op(t: Transport, spec: HostSpec) -> tuple[str, NodeStatus]:
        st = node_status(t, targets.dir_for(spec), history=history)
        if st.state_unsafe:  # its backups and history were not read: the node's state is unknown, and says why
            raise DeployError(f"{t.name}:{st.target_dir}: {st.problem}")
        st = with_pods(t, st)
        return ("ok" if st.path else "missing"), st  # no library: the node is not in a known state

    with progress(len(targets.specs), "status") as done:
        fleet = run_fleet(targets.specs, op, targets.connect, parallel=parallel, canary=0, keep_going=True,
                          on_done=done)
    for o in fleet.outcomes:  # e.g. undecodable history lines that were skipped: on stderr, never fatal
        for w in o.result.warnings if o.result is not None else []:
            click.echo(f"vgpu-patch: warning: {o.node}: {w}", err=True)
    if as_json:
        emit_json(fleet.to_dict())
    else:
        status_table(fleet)
        stale_table(fleet)
    code = fleet.exit_code()
    if code == EXIT_OK and any(o.result is not None and o.result.replaced_outside for o in fleet.outcomes):
        code = EXIT_REPLACED
    raise SystemExit(code)
