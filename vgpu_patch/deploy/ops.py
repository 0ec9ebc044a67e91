"""Operations: compare a node's facts with the wanted state and yield only the steps needed.

Pure functions over NodeFacts (no I/O). Each step carries the shell it runs (script.py), so `--dry-run`
shows exactly what the real run sends, and the swap script is nothing but the plan's fragments joined.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..report.errors import DeployError
from .candidate import Candidate
from .facts import LIB, STATE, LibFile, NodeFacts
from .request import SwapRequest

# Room kept free beyond what the swap writes, so the node is never filled to the last block.
SPACE_MARGIN = 1 << 20


@dataclass(frozen=True)
class Step:
    kind: str  # prepare | create | upload | stage | verify | lock | backup | swap | record | report | noop
    text: str
    sh: str = ""  # the node.sh calls this step sends ("" for a noop or a step run on this machine)

    @property
    def code(self) -> str:
        """The node.sh functions those calls run (for `--dry-run`: what will happen on the node, exactly)."""
        from .script import code_of

        return code_of(self.sh)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text, "sh": self.sh, "code": self.code}


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
    if not facts.dir_exists and not install:
        raise DeployError(f"{where}: the directory does not exist (is HAMi installed? check --target-dir); "
                          f"pass --install to create it and install {LIB} there")
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
    return 2 * cand.size + backup + SPACE_MARGIN  # the upload (/tmp may share the disk) + same-dir temp + backup


def plan_swap(
    facts: NodeFacts, live: LibFile | None, live_path: str, want_sha: str, req: SwapRequest, *, source: str,
    params: str = "", receive: int | None = None,
) -> Iterator[Step]:
    """The steps `req` takes (a candidate, or for a rollback the backup `source`), each a node.sh call; only a
    noop when nothing differs. `receive`: the candidate's size when it follows the calls on stdin."""
    upload, byte_compare, stale = req.candidate is not None, req.action == "rollback", req.stale
    in_lock = req.hooks.in_lock if req.hooks else ""
    pause = bool(req.hooks and req.hooks.after_upload and receive is not None)
    if live is not None and live.sha256 == want_sha:
        yield Step("noop", f"{live_path} already has sha256 {want_sha[:12]}: nothing to do")
        return
    state = f"{facts.target_dir}/{STATE}"
    yield Step("prepare", "set the parameters, the clean-up trap and the clock", params + "\nbegin")
    if not facts.dir_exists:  # only with --install (preflight refuses it otherwise)
        yield Step("create", f"create {facts.target_dir} (mode 0755, with its parents)", "make_dir")
    yield Step("verify", f"refuse {state} if it holds symlinks or (as root) anything not root's alone", "safe_state")
    yield Step("lock", f"take {state}/lock", "lock" + ("\n" + in_lock if in_lock else ""))
    if receive is not None:  # the candidate follows the calls on the session's stdin
        yield Step("upload", f"receive {source} on stdin into a new 0600 temp file beside the live file",
                   f"receive {int(receive)}" + ("\npause" if pause else ""))
    else:
        what = f"the upload of {source} (0600)" if upload else source
        yield Step("upload" if upload else "stage", f"copy {what} beside the live file", "stage")
    yield Step("verify", f"verify sha256 {want_sha[:12]} of the temp file on the node", "verify_source")
    yield Step("verify", "check it loads: LD_PRELOAD=<it> /bin/true", "load_test")
    if live is not None:
        if facts.backup(live.sha256) is None:
            text = f"back up {live_path} ({live.sha256[:12]}) to {state}/backups/{live.sha256}.so"
        else:
            text = f"backup of {live.sha256[:12]} already kept"
        yield Step("backup", text, "back_up")
    else:
        yield Step("backup", "nothing live to back up (new install)", "back_up")
    if req.signature is not None and upload:
        yield Step("record", f"keep its signature by {req.signature.signer} as {state}/signatures/"
                   f"{want_sha}.sig", "keep_signature")
    yield Step(
        "swap",
        f"give the temp file the live file's mode and owner, fsync, rename it over {live_path}, fsync "
        f"{facts.target_dir}"
        + ("" if live is not None else " (new install)"),
        "swap_in",
    )
    bytewise = ", and byte for byte" if byte_compare else ""
    yield Step("verify", f"verify sha256 of {live_path} is {want_sha[:12]}{bytewise}",
               "reverify" + ("\nbyte_compare" if byte_compare else ""))
    yield Step("record", f"append to {state}/history.jsonl", "record")
    yield Step("report", "print the result" + (" and the processes mapping the library" if stale else ""), "report")
