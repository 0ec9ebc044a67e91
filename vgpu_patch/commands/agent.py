"""`vgpu-patch agent`: the DaemonSet's node agent (install, watch, repair; probe; rollback)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..report.errors import EXIT_FAILED
from .options import allowed_signers_option, emit_json, json_option, verbose_option

if TYPE_CHECKING:
    from ..k8s.report import NodeReporter

EPILOG = """\b
Examples:
  # in the DaemonSet: install, then keep the library in place
  vgpu-patch agent --library /opt/vgpu-patch/libvgpu.so --host-root /host \\
      --target-dir /usr/local/vgpu --metrics-port 9400
  # readiness probe: exit 0 when the live file is the image's library
  vgpu-patch agent --probe --library /opt/vgpu-patch/libvgpu.so --host-root /host
  # one pass (install or repair), then exit
  vgpu-patch agent --once --json --library /opt/vgpu-patch/libvgpu.so --host-root /host
  # put back the file the agent replaced (the running agent then stops enforcing)
  kubectl -n kube-system exec ds/vgpu-patch-agent -- vgpu-patch agent --rollback

\b
Exit codes: 0 ok (probe: ready); 1 failed, refused image content, or probe: not ready; 2 usage error.
"""


@click.command("agent", epilog=EPILOG)
@verbose_option
@click.option("--library", type=click.Path(dir_okay=False, path_type=Path), default=Path("/opt/vgpu-patch/libvgpu.so"),
              show_default=True, help="The library shipped in the image.")
@click.option("--sha256", "sha256", metavar="HEX", help="Expected sha256 of --library (default: its manifest).")
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path),
              help="Build manifest holding the expected sha256 [default: <library>.json].")
@click.option("--host-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/host"), show_default=True,
              help="Where the host's filesystem (or the library dir's hostPath) is mounted.")
@click.option("--target-dir", default="/usr/local/vgpu", show_default=True,
              help="The library directory as a host path (HAMi's /usr/local/vgpu).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=10.0, show_default=True,
              help="Seconds between re-checks (inotify wakes the agent sooner).")
@click.option("--watch", type=click.Choice(["auto", "inotify", "poll"]), default="auto", show_default=True,
              help="How to notice another writer: inotify where available, else polling.")
@click.option("--once", is_flag=True, help="Install or repair once, then exit.")
@click.option("--probe", is_flag=True, help="Readiness probe: exit 0 when the live file is the image's library.")
@click.option("--rollback", "do_rollback", is_flag=True, help="Restore the file the last recorded swap replaced.")
@click.option("--to", "to_sha256", metavar="SHA256", help="With --rollback: the backup to restore (6+ hex digits).")
@click.option("--status-file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/run/vgpu-patch/agent.json"), show_default=True, help="JSON status, rewritten each check.")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /metrics (Prometheus), /readyz and /healthz (200 only while ready) and /livez (the "
                   "watch loop's heartbeat) on this port; off by default.")
@click.option("--metrics-addr", default=None,
              help="Address for --metrics-port [default: $POD_IP when set; else all addresses inside a Kubernetes "
                   "pod (its own network namespace: the pod IP and loopback); else 127.0.0.1].")
@click.option("--operator", default="", help="Recorded in history.jsonl [default: agent@$NODE_NAME].")
@click.option("--proc-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/proc"), show_default=True,
              help="The host's /proc (the pod needs hostPID): processes still on an old library and their pods.")
@click.option("--no-stale-scan", is_flag=True, help="Do not look for processes still mapping an old library.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Exists only while ready: an exec readiness probe is `test -e FILE` [default: `ready` beside "
                   "--status-file].")
@click.option("--stuck-after", type=click.FloatRange(min=1), default=None,
              help="Liveness (/livez) fails when the watch loop has not turned for this many seconds "
                   "[default: max(120, 3*interval+60)].")
@click.option("--report", "report", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Annotate this node with the live sha256 and the pods still on an old library; "
                   "auto = when a service-account token is mounted.")
@click.option("--node-name", envvar="NODE_NAME", default=None, help="This node's name [default: $NODE_NAME].")
@click.option("--api-server", default=None, metavar="URL", help="Kubernetes API URL [default: in-cluster].")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Bearer token for --api-server.")
@allowed_signers_option
@json_option
def cli(library: Path, sha256: str | None, manifest: Path | None, allowed_signers: str | None, host_root: Path,
        target_dir: str, interval: float, watch: str, once: bool, probe: bool, do_rollback: bool,
        to_sha256: str | None, status_file: Path, metrics_port: int | None, metrics_addr: str | None, operator: str,
        proc_root: Path, no_stale_scan: bool, ready_file: Path | None, stuck_after: float | None, report: str,
        node_name: str | None, api_server: str | None, token_file: Path | None, as_json: bool) -> None:
    """Install the image's libvgpu.so into the host's library directory and keep it there.

    Uses the same protocol and on-node state as `vgpu-patch deploy` (lock, backups, history.jsonl with
    tool "agent"). It re-applies the library when a writer that records nothing (HAMi's device plugin
    copying its own file back on restart) replaces it, and stops enforcing when an operator's recorded
    change (a rollback or deploy by the CLI or Ansible) replaced it.
    """
    from ..agent.loop import Agent, AgentConfig, log
    from ..agent.loop import probe as run_probe

    if sum((once, probe, do_rollback)) > 1:
        raise click.UsageError("--once, --probe and --rollback are exclusive: pick one")
    if to_sha256 and not do_rollback:
        raise click.UsageError("--to needs --rollback")
    if probe:
        doc = run_probe(library, host_root, target_dir, sha256=sha256, manifest=manifest)
        if as_json:
            emit_json(doc)
        elif not doc["ready"]:
            click.echo(f"not ready: {doc['live_path']} has sha256 {doc['live_sha256']}, want {doc['want_sha256']}",
                       err=True)
        sys.exit(0 if doc["ready"] else EXIT_FAILED)

    reporter = _reporter(report, node_name, api_server, token_file) if not (do_rollback or probe) else None
    cfg = AgentConfig(library=library, host_root=host_root, target_dir=target_dir, interval=interval, sha256=sha256,
                      manifest=manifest, status_file=status_file, operator=operator, watch=watch,
                      # a rollback puts back a recorded backup, signed or not (the vendor's file never is)
                      allowed_signers=None if do_rollback or not allowed_signers else Path(allowed_signers),
                      proc=None if no_stale_scan else proc_root, ready_file=ready_file, stuck_after=stuck_after or 0.0,
                      reporter=reporter)
    agent = Agent(cfg)
    if do_rollback:
        res = agent.rollback(to_sha256)
        if as_json:
            emit_json(res.to_dict())
        else:
            click.echo(f"{res.path}: {'rolled back to' if res.changed else 'already'} {res.to_sha256}", err=True)
        return
    if once:
        status = agent.run(once=True)
        if as_json:
            emit_json(status.to_dict())
        sys.exit(0 if status.ready else EXIT_FAILED)

    server = None
    if metrics_port is not None:
        from ..agent.metrics import serve

        addr = metrics_addr or default_metrics_addr()
        server = serve(agent.snapshot, metrics_port, addr, stuck_after=cfg.stuck_seconds)
        log(f"metrics on http://{addr}:{server.server_address[1]}/metrics (at most {server.max_conns} clients)")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    try:
        status = agent.run()
    finally:
        if server is not None:
            server.shutdown()
    if as_json:
        emit_json(status.to_dict())



def default_metrics_addr() -> str:
    """Where --metrics-port listens unless told: the pod IP, a pod's own namespace, or only this machine."""
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    # kubelet sets KUBERNETES_SERVICE_HOST in every pod; without hostNetwork, all addresses = pod IP + loopback
    return "0.0.0.0" if os.environ.get("KUBERNETES_SERVICE_HOST") else "127.0.0.1"


def _reporter(mode: str, node: str | None, server: str | None, token_file: Path | None) -> NodeReporter | None:
    """The node reporter for --report, None when off (auto: only with a mounted service-account token)."""
    from ..k8s import api

    if mode == "off":
        return None
    client = api.Client(server, token_file=token_file) if server else api.in_cluster()
    if client is None:
        if mode == "on":
            raise click.UsageError("--report on: no service-account token is mounted and no --api-server was given")
        return None
    if not node:
        if mode == "on":
            raise click.UsageError("--report on needs this node's name: set NODE_NAME or --node-name")
        from ..agent.loop import log

        log("not reporting to the Kubernetes API: NODE_NAME is not set (the DaemonSet sets it)")
        return None
    from ..k8s.report import NodeReporter

    return NodeReporter(client, node)
