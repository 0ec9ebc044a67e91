"""`vgpu-patch restart-plan`: which pods still run an old library (from the agents' node annotations); --evict them."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ..report.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL
from .options import emit_json, json_option, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch restart-plan                      # every node the agent reported on (kubeconfig's context)
  vgpu-patch restart-plan --node gpu-node-1 --json
  kubectl proxy & vgpu-patch restart-plan --api-server http://127.0.0.1:8001 --evict --yes
  vgpu-patch restart-plan --evict --dry-run    # ask the API which evictions it would admit

\b
Exit codes: 0 listed (--json "counts" says how many pods are left), or every eviction admitted; 1 API
failure, or every eviction refused; 2 usage error; 3 some evictions blocked by a PodDisruptionBudget or failed,
or some pods unknown (the API kept failing). Pods the report names on another node are `refused`, never evicted.
"""


@click.command("restart-plan", epilog=EPILOG)
@verbose_option
@click.option("--node", "nodes", multiple=True, metavar="NAME", help="Only this node (repeatable) [default: all].")
@click.option("-l", "--selector", default=None, help="Label selector for nodes, e.g. gpu=on.")
@click.option("--evict", "do_evict", is_flag=True, help="Evict the listed pods through the Eviction API (PDBs apply).")
@click.option("--dry-run", is_flag=True, help="With --evict: the API checks each eviction but nothing is evicted.")
@click.option("--yes", is_flag=True, help="With --evict: do not ask for confirmation.")
@click.option("--include-unmanaged", is_flag=True,
              help="With --evict: also evict pods no controller recreates (that deletes them, like drain --force).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config; in a pod: its service account].")
@click.option("--context", default=None, help="kubeconfig context [default: the current one].")
@click.option("--api-server", default=None, metavar="URL",
              help="API server URL, e.g. `kubectl proxy`'s http://127.0.0.1:8001 (then no credentials are needed).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Bearer token file for --api-server.")
@click.option("--insecure", is_flag=True, help="Do not verify the API server's TLS certificate (--api-server only).")
@json_option
def cli(nodes: tuple[str, ...], selector: str | None, do_evict: bool, dry_run: bool, yes: bool,
        include_unmanaged: bool, kubeconfig: Path | None,
        context: str | None, api_server: str | None, token_file: Path | None, insecure: bool, as_json: bool) -> None:
    """List the pods whose containers still map an old copy of the library (they keep it until they restart),
    as the node agents reported them in their Node annotations (the DaemonSet needs --rbac), checked against
    the API so pods that restarted since are left out. With --evict, evict them (the Eviction API honours
    PodDisruptionBudgets: a refusal is reported as blocked, never forced).
    """
    from ..k8s import api
    from ..k8s.restart import build_plan, evict

    if (dry_run or include_unmanaged) and not do_evict:
        raise click.UsageError("--dry-run and --include-unmanaged go with --evict")
    client = api.connect(api_server, token_file=token_file, kubeconfig=kubeconfig, context=context, insecure=insecure)
    plan = build_plan(client, nodes=list(nodes) or None, label_selector=selector)
    todo = [e for e in plan.entries if e.state == "restart" or (include_unmanaged and e.state == "unmanaged")]
    if do_evict and todo and not (yes or dry_run or as_json):
        click.confirm(f"evict {len(todo)} pod(s): {', '.join(f'{e.namespace}/{e.name}' for e in todo)}?", abort=True,
                      err=True)
    if do_evict:
        evict(client, plan, dry_run=dry_run, include_unmanaged=include_unmanaged)
    if as_json:
        emit_json(plan.to_dict())
    else:
        _table(plan)
    sys.exit(_exit_code(plan, do_evict))


def _exit_code(plan, do_evict: bool) -> int:
    states = [e.state for e in plan.entries]
    if not do_evict:
        return EXIT_OK
    bad = sum(s in ("blocked", "failed", "unknown") for s in states)
    good = sum(s in ("evicted", "would-evict") for s in states)
    if not bad:
        return EXIT_OK
    return EXIT_PARTIAL if good else EXIT_FAILED


def _table(plan) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vgpu-patch restart-plan", title_justify="left")
    for col in ("node", "pod", "containers", "pids", "state", "detail"):
        table.add_column(col, overflow="fold")
    for e in plan.entries:
        pod = f"{e.namespace}/{e.name}" if e.name else e.pod_uid
        table.add_row(e.node, pod, ", ".join(c[:12] for c in e.containers) or "-", " ".join(map(str, e.pids)),
                      e.state, e.detail)
    for n in plan.nodes:
        if n["host_pids"]:
            table.add_row(n["node"], "(host processes)", "-", " ".join(map(str, n["host_pids"])), "restart",
                          "not in a pod: restart them by hand")
        if n["problem"]:
            table.add_row(n["node"], "-", "-", "-", "-", n["problem"])
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    console.print(table)
    counts = plan.to_dict()["counts"]
    console.print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no pod runs an old library")
