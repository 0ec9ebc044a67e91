"""Operations: compare a node's facts with the wanted state and yield only the steps needed.

Pure functions over NodeFacts (no I/O), so `--dry-run` and the real run share one plan.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DeployError
from .candidate import Candidate
from .facts import LIB, STATE, LibFile, NodeFacts

# Room kept free beyond what the swap writes, so the node is never filled to the last block.
SPACE_MARGIN = 1 << 20


@dataclass(frozen=True)
class Step:
    kind: str  # upload | verify | lock | backup | swap | record | noop
    text: str


def preflight(facts: NodeFacts, cand: Candidate, node: str, live: LibFile | None, *, install: bool) -> None:
    """Refuse, one line each, what would break the node or fail half-way."""
    where = f"{node}:{facts.target_dir}"
    if not cand.runs_on(facts.arch):
        raise DeployError(
            f"{node}: {cand.path.name} is built for {cand.machine} but the node is {facts.arch}; build for {facts.arch}"
        )
    if cand.glibc_private:
        raise DeployError(f"{node}: {cand.path.name} imports GLIBC_PRIVATE symbols; rebuild it (never deployable)")
    if cand.glibc_needed and facts.glibc and cand.glibc_needed > facts.glibc:
        need, have = ".".join(map(str, cand.glibc_needed)), ".".join(map(str, facts.glibc))
        raise DeployError(
            f"{node}: {cand.path.name} needs GLIBC_{need} but the node has glibc {have}; "
            f"build with a glibc floor <= {have}"
        )
    if live is None and not install:
        raise DeployError(f"{where}: no {LIB} here to replace; check --target-dir, or pass --install to install one")
    needed = space_needed(facts, cand, live)
    if facts.free_bytes is not None and facts.free_bytes < needed:
        raise DeployError(
            f"{where}: not enough free space ({facts.free_bytes // 1024} KiB free, {needed // 1024} KiB needed "
            f"for staging, backup and swap); free some space, then rerun"
        )


def space_needed(facts: NodeFacts, cand: Candidate, live: LibFile | None) -> int:
    backup = live.size if live is not None and facts.backup(live.sha256) is None else 0
    return 2 * cand.size + backup + SPACE_MARGIN  # staged copy + same-dir temp + backup


def plan_swap(
    facts: NodeFacts, live: LibFile | None, live_path: str, want_sha: str, *, source: str, upload: bool
) -> Iterator[Step]:
    """The steps a deploy (upload=True) or rollback (source = a backup) takes; only a noop when nothing differs."""
    if live is not None and live.sha256 == want_sha:
        yield Step("noop", f"{live_path} already has sha256 {want_sha[:12]}: nothing to do")
        return
    state = f"{facts.target_dir}/{STATE}"
    yield Step("lock", f"take {state}/lock")
    if upload:
        yield Step("upload", f"upload {source} to {state}/staging/{want_sha}.so")
    yield Step("verify", f"verify sha256 {want_sha[:12]} of {'the staged file' if upload else source} on the node")
    yield Step("verify", "check it loads: LD_PRELOAD=<it> /bin/true")
    if live is not None:
        if facts.backup(live.sha256) is None:
            yield Step("backup", f"back up {live_path} ({live.sha256[:12]}) to {state}/backups/{live.sha256}.so")
        else:
            yield Step("backup", f"backup of {live.sha256[:12]} already kept")
    yield Step(
        "swap",
        f"write a temp file beside {live_path}, fsync, rename over it, fsync {facts.target_dir}"
        + ("" if live is not None else " (new install)"),
    )
    yield Step("verify", f"verify sha256 of {live_path} is {want_sha[:12]}")
    yield Step("record", f"append to {state}/history.jsonl")
