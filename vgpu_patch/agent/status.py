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
    watch: str = ""
    checks: int = 0
    deploys: int = 0
    reapplies: int = 0
    errors: int = 0
    last_check: str | None = None
    last_check_unix: float = 0.0
    last_change: dict | None = None  # the history record of the agent's last swap
    last_error: str | None = None
    yielded_to: dict | None = None  # the operator's history record the agent stopped fighting
    version: str = __version__
    pid: int = field(default_factory=os.getpid)

    @property
    def ready(self) -> bool:
        return self.live_sha256 == self.want_sha256

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ready"] = self.ready
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


def read_status(path: Path) -> dict:
    return json.loads(path.read_text())
