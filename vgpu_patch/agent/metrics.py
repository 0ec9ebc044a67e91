"""Prometheus text metrics for the agent, served by the standard library's http.server."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .status import AgentStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(s: AgentStatus) -> str:
    """The exposition text for one status snapshot."""
    rows = [
        ("vgpu_patch_agent_ready", "gauge", "Whether the live library is the image's library (1) or not (0)",
         int(s.ready)),
        ("vgpu_patch_agent_yielded", "gauge",
         "Whether the agent stopped enforcing after an operator's recorded change (1) or not (0)",
         int(s.state == "yielded")),
        ("vgpu_patch_agent_checks_total", "counter", "Checks of the live library", s.checks),
        ("vgpu_patch_agent_deploys_total", "counter", "Installs of the image's library (history action deploy)",
         s.deploys),
        ("vgpu_patch_agent_reapplies_total", "counter",
         "Re-installs after another writer replaced the library (history action reapply)", s.reapplies),
        ("vgpu_patch_agent_errors_total", "counter", "Checks or swaps that failed", s.errors),
        ("vgpu_patch_agent_last_check_timestamp_seconds", "gauge", "Unix time of the last check", s.last_check_unix),
    ]
    out = []
    for name, kind, help_text, value in rows:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    info = {
        "version": s.version,
        "state": s.state,
        "watch": s.watch,
        "live_path": s.live_path or "",
        "want_sha256": s.want_sha256,
        "live_sha256": s.live_sha256 or "",
    }
    labels = ",".join(f'{k}="{_label(v)}"' for k, v in info.items())
    out += ["# HELP vgpu_patch_agent_info The agent's configuration and state", "# TYPE vgpu_patch_agent_info gauge",
            f"vgpu_patch_agent_info{{{labels}}} 1"]
    return "\n".join(out) + "\n"


def serve(snapshot: Callable[[], AgentStatus], port: int, addr: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve /metrics (and /healthz, 200 when ready) from a daemon thread; returns the server (port 0 = any)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name for the handler
            s = snapshot()
            if self.path.split("?", 1)[0] == "/metrics":
                code, body, ctype = 200, render(s).encode(), CONTENT_TYPE
            elif self.path == "/healthz":
                code, body, ctype = (200 if s.ready else 503), (s.state + "\n").encode(), "text/plain"
            else:
                code, body, ctype = 404, b"not found: try /metrics\n", "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes every few seconds: stay quiet
            pass

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="vgpu-agent-metrics", daemon=True).start()
    return server
