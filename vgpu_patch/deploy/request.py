"""One swap request, built once by its caller (the CLI per run, the agent at start) and passed down one path:
swap.swap and every node it reaches take the same object, and ops.plan_swap reads its policy from it."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .. import __version__
from ..release.signing import Signature
from .candidate import Candidate

DEFAULT_DIR = "/usr/local/vgpu"
DEFAULT_TOOL = f"vgpu-patch {__version__}"


@dataclass
class SwapHooks:
    """Test seams: `after_upload(real_path)` runs between upload and the swap; `in_lock` is sh run holding the lock."""

    after_upload: Callable[[str], None] | None = None
    in_lock: str = ""


@dataclass(frozen=True, kw_only=True)
class SwapRequest:
    """One swap, built once by its caller (the CLI per run, the agent at start) and taken down one path: what
    goes live (an inspected candidate, or a backup for a rollback), where, as whom, and how."""

    operator: str
    action: str = "deploy"  # deploy | reapply: `candidate` goes live; rollback: the backup `to_sha256` names
    candidate: Candidate | None = None
    to_sha256: str | None = None  # rollback: previous | vendor | a backup's sha256 (6+ hex)
    target_dir: str = DEFAULT_DIR
    tool: str = DEFAULT_TOOL
    install: bool = False  # install where the directory has no library yet
    check: bool = False  # run `check` on the candidate against the live file first
    stale: bool = False  # also list the processes still mapping the old library (reads every maps file)
    dry_run: bool = False
    hooks: SwapHooks | None = None
    should_stop: Callable[[], bool] | None = None
    signature: Signature | None = None  # the candidate's verified signature: the node keeps it (keep_signature)

    @property
    def node_dir(self) -> str:
        return self.target_dir.rstrip("/") or "/"

    def at(self, target_dir: str) -> SwapRequest:
        """The same request for another node's library directory."""
        return replace(self, target_dir=target_dir)
