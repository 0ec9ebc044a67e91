"""Prometheus text metrics and health endpoints for the agent, served by the bounded server of httpd.py.

Every endpoint answers from the same published snapshot (`Agent.snapshot()`), so /readyz, /healthz, the
`vgpu_patch_agent_ready` metric and the status file always say the same thing:
- /readyz and /healthz: 200 `ready` while the live file is the image's library and the agent is in state ok;
  else 503 `not ready: <reason>` (never "ok");
- /livez: 200 `alive` while the watch loop has turned within `stuck_after` seconds; else 503 `stuck: ...`;
- /metrics: the exposition text, including one `vgpu_patch_agent_stale_pod_processes` series per pod.
"""
from __future__ import annotations

import time
from typing import Callable

from .httpd import BoundedServer
from .status import AgentStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict[str, object]) -> str:
    return ",".join(f'{k}="{_label(v)}"' for k, v in d.items())


def render(s: AgentStatus, now: float | None = None) -> str:
    """The exposition text for one status snapshot."""
    rows = [
        ("vgpu_patch_agent_ready", "gauge",
         "Whether the live library is the image's library and the agent is in state ok (1) or not (0)", int(s.ready)),
        ("vgpu_patch_agent_yielded", "gauge",
         "Whether the agent stopped enforcing after an operator's recorded change (1) or not (0)",
         int(s.state == "yielded")),
        ("vgpu_patch_agent_error", "gauge", "Whether the last check failed (1) or not (0)", int(s.state == "error")),
        ("vgpu_patch_agent_checks_total", "counter", "Checks of the live library", s.checks),
        ("vgpu_patch_agent_deploys_total", "counter", "Installs of the image's library (history action deploy)",
         s.deploys),
        ("vgpu_patch_agent_reapplies_total", "counter",
         "Re-installs after another writer replaced the library (history action reapply)", s.reapplies),
        ("vgpu_patch_agent_copy_backs_total", "counter",
         "Times the live library was found replaced outside vgpu-patch (the device plugin's copy-back?)",
         s.copy_backs),
        ("vgpu_patch_agent_errors_total", "counter", "Checks or swaps that failed", s.errors),
        ("vgpu_patch_agent_api_errors_total", "counter", "Failed reports to the Kubernetes API", s.api_errors),
        ("vgpu_patch_agent_last_check_timestamp_seconds", "gauge", "Unix time of the last check", s.last_check_unix),
        ("vgpu_patch_agent_heartbeat_age_seconds", "gauge", "Seconds since the watch loop last turned",
         round(s.heartbeat_age(now), 3)),
    ]
    if s.stale_scanned:
        rows.append(("vgpu_patch_agent_stale_processes", "gauge",
                     "Processes still mapping an older copy of the library (restart their containers)",
                     s.stale_processes))
    out = []
    for name, kind, help_text, value in rows:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    if s.stale_scanned:
        name = "vgpu_patch_agent_stale_pod_processes"
        out += [f"# HELP {name} Processes of one pod still mapping an older copy of the library",
                f"# TYPE {name} gauge"]
        for p in s.stale_pods:
            labels = {"pod_uid": p["pod_uid"], "namespace": p.get("namespace") or "", "pod": p.get("name") or ""}
            out.append(f"{name}{{{_labels(labels)}}} {len(p['pids'])}")
        if s.stale_host_pids:
            out.append(f'{name}{{pod_uid="",namespace="",pod=""}} {len(s.stale_host_pids)}')
    info = {
        "version": s.version,
        "state": s.state,
        "watch": s.watch,
        "live_path": s.live_path or "",
        "want_sha256": s.want_sha256,
        "live_sha256": s.live_sha256 or "",
        "live_signer": (s.live_signer or {}).get("principal", ""),  # empty: unsigned
        "api": s.api,
        "stale_scope": s.stale_scope,
    }
    out += ["# HELP vgpu_patch_agent_info The agent's configuration and state", "# TYPE vgpu_patch_agent_info gauge",
            f"vgpu_patch_agent_info{{{_labels(dict(info))}}} 1"]
    return "\n".join(out) + "\n"


def health(s: AgentStatus, path: str, stuck_after: float, now: float | None = None) -> tuple[int, str] | None:
    """(HTTP code, body) of a health endpoint, None for another path."""
    if path in ("/readyz", "/healthz"):
        return (200, "ready\n") if s.ready else (503, f"not ready: {s.reason}\n")
    if path == "/livez":
        age = s.heartbeat_age(now)
        if s.heartbeat_unix and age > stuck_after:
            return 503, f"stuck: the watch loop last turned {age:.0f}s ago (limit {stuck_after:.0f}s)\n"
        return 200, "alive\n"
    return None


def answer(snapshot: Callable[[], AgentStatus], path: str, stuck_after: float) -> tuple[int, str, str]:
    """(HTTP code, content type, body) for one GET of `path`."""
    s, now = snapshot(), time.time()
    if path == "/metrics":
        return 200, CONTENT_TYPE, render(s, now)
    code, body = health(s, path, stuck_after, now) or (404, "not found: try /metrics, /readyz or /livez\n")
    return code, "text/plain; charset=utf-8", body


def serve(snapshot: Callable[[], AgentStatus], port: int, addr: str = "127.0.0.1", *, stuck_after: float = 120.0,
          max_conns: int = 64, header_timeout: float = 5.0) -> BoundedServer:
    """Serve /metrics, /readyz, /healthz and /livez from one daemon thread (httpd.py bounds every client).

    Returns the running server (port 0 = any free port); `shutdown()` stops it.
    """
    return BoundedServer(addr, port, lambda path: answer(snapshot, path, stuck_after), max_conns=max_conns,
                         header_timeout=header_timeout, name="vgpu-agent-metrics").start()
