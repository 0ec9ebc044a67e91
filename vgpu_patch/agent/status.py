"""The agent's state: one dataclass, written as a JSON status file (atomically) and read by metrics."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import __version__

# state values: starting | ok | yielded (a recorded change by an operator is respected) | error
STATES = ("starting", "ok", "yielded", "error")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class AgentStatus:
    node: str
    library: str
    want_sha256: str
    target_dir: str
    state: str = "starting"
    live_path: str | None = None
    live_sha256: str | None = None
    live_signer: dict | None = None  # who signed the live file ({"principal", "key"}), None: unsigned
    provenance: dict | None = None  # what the image library's signed build provenance says (--allowed-signers)
    watch: str = ""
    checks: int = 0
    deploys: int = 0
    reapplies: int = 0
    copy_backs: int = 0  # times the live file was found replaced outside vgpu-patch (the plugin's copy-back?)
    errors: int = 0
    last_check: str | None = None
    last_check_unix: float = 0.0
    last_change: dict | None = None  # the history record of the agent's last swap
    last_error: str | None = None
    yielded_to: dict | None = None  # the operator's history record the agent stopped fighting
    version: str = __version__
    pid: int = field(default_factory=os.getpid)
    heartbeat_unix: float = 0.0  # the watch loop's last turn: liveness judges its age
    # processes still mapping an older copy of the library (hostPID or the host's /proc needed)
    stale_scanned: bool = False
    stale_scope: str = ""  # host | pid-namespace (no hostPID: other pods are invisible) | unknown
    stale_pods: list[dict] = field(default_factory=list)
    stale_host_pids: list[int] = field(default_factory=list)
    stale_processes: int = 0
    api: str = "off"  # off | ok | error: reporting to the Kubernetes API (node annotations)
    api_error: str | None = None
    api_errors: int = 0

    @property
    def ready(self) -> bool:
        """One verdict for the status file, /healthz, /readyz and the metric: running state ok on our library."""
        return self.state == "ok" and self.last_error is None and self.live_sha256 == self.want_sha256

    @property
    def reason(self) -> str:
        """Why the agent is not ready (empty when it is): the line /healthz and the status file carry."""
        if self.ready:
            return ""
        if self.state == "error":
            return f"error: {self.last_error}"
        if self.state == "yielded":
            y = self.yielded_to or {}
            return (f"yielded: {y.get('action')} by {y.get('tool')} ({y.get('operator')}) set {self.live_path} to "
                    f"{(self.live_sha256 or '?')[:12]}; restart the agent to enforce again")
        if self.state == "starting":
            return "starting: no check finished yet"
        live = (self.live_sha256 or "none")[:12]
        return f"{self.live_path or 'the library'} has sha256 {live}, want {self.want_sha256[:12]}"

    def heartbeat_age(self, now: float | None = None) -> float:
        return max(0.0, (now if now is not None else time.time()) - self.heartbeat_unix) if self.heartbeat_unix else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ready"] = self.ready
        d["reason"] = self.reason
        return d


def write_status(path: Path, status: AgentStatus) -> None:
    """Replace the status file atomically so readers never see half a document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(status.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_ready_marker(path: Path, ready: bool) -> None:
    """A file that exists only while ready: an exec readiness probe is then `test -e` (no interpreter)."""
    if ready:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_status(path: Path) -> dict:
    return json.loads(path.read_text())
