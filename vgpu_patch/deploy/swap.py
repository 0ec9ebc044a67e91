"""The swap protocol of docs/node-state.md: deploy_file, rollback and node_status over any Transport.

Per changed node, one privileged session: the probe prints the node's facts and waits; this side plans
and sends the swap script, then the candidate's bytes, on the same stdin; the script takes the lock,
verifies, backs up, swaps atomically, re-verifies and records. (Where sudo needs a password or a terminal
the probe, an SFTP upload and the script are three round trips instead.) Every check the script makes
happens before the rename or is a read-only re-check after it, so a failure leaves a whole file live.
"""
from __future__ import annotations

import contextlib
import json
import secrets
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..report.errors import DeployError, IntegrityError, LockedError, StopRequested, UsageError, VgpuPatchError
from ..transport.base import Result, Transport, first_line
from . import facts as F
from . import script as S
from .candidate import Candidate, inspect
from .ops import Step, plan_swap, preflight
from .request import DEFAULT_DIR, DEFAULT_TOOL, SwapHooks, SwapRequest

_LOCKED, _MISMATCH, _NOLOAD, _VERIFY, _WRITE, _UNSAFE = (
    S.LOCKED, S.MISMATCH, S.NOLOAD, S.VERIFY, S.WRITE, S.UNSAFE)
UPLOAD_DIR = "/tmp"


# the caller's judgement after the probe (the agent's policy): the request to carry out, or None for nothing
Judge = Callable[[F.NodeFacts, "F.LibFile | None"], "SwapRequest | None"]


@dataclass
class SwapResult:
    node: str
    action: str
    changed: bool
    path: str
    from_sha256: str | None
    to_sha256: str
    backup: str | None = None
    plan: list[Step] = field(default_factory=list)
    pending: bool = False  # dry-run: changes would be made
    stale_pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = [s.to_dict() for s in self.plan]
        return d


@dataclass
class NodeStatus:
    node: str
    target_dir: str
    path: str | None
    sha256: str | None
    ours: bool
    version: str | None
    size: int | None
    backups: list[dict]
    history: list[dict]
    stale_pids: list[int]
    arch: str = ""
    glibc: str | None = None
    problem: str | None = None  # e.g. an ambiguous directory; the rest is still reported
    warnings: list[str] = field(default_factory=list)  # e.g. undecodable history lines that were skipped
    live_why: str = ""  # the evidence that made `path` the live file (the node program's words)
    replaced_outside: bool = False  # the live file differs from the last recorded change (copy-back?)
    delivered_by_plugin: bool = False  # the device plugin's image installed it (vgpu-patch plugin-image)
    other_files: list[str] = field(default_factory=list)  # every other libvgpu.so*: leftovers, old versions
    signer: dict | None = None  # who signed the live file ({"principal", "key"}, verified when it was deployed)
    state_unsafe: bool = False  # the state dir is not read through (a symlink, not root's): `problem` says why

    def to_dict(self) -> dict:
        return asdict(self)


def _params(t: Transport, req: SwapRequest, live_path: str, want: str, *, up: str | None, src: str | None,
            updir: str | None) -> str:
    """node.sh's parameters for one swap: real paths for the node's shell, the node's own path for the record;
    a candidate's verified signature travels in the same script (no extra round trip, none without one)."""
    signed = {}
    if req.signature is not None and req.candidate is not None:
        signed = {"SIG": req.signature.text, "SIGNERJ": json.dumps(req.signature.signer.to_dict())}
    return S.params(D=t.path(req.node_dir), LIVE=t.path(live_path), WANT=want, UP=up or "", SRC=src or "",
                    UPDIR=updir or "", LIVEJ=S.jstr(live_path), ACTJ=S.jstr(req.action), OPJ=S.jstr(req.operator),
                    TOOLJ=S.jstr(req.tool), STALE=1 if req.stale else 0, **signed)


def _raise_for(t: Transport, code: int, out: str, where: str) -> None:
    msg = next((ln[6:].strip() for ln in out.splitlines() if ln.startswith("@@err ")), "") or first_line(out)
    if code == _LOCKED:
        raise LockedError(
            f"{t.name}: another deploy or rollback holds {where}/{F.STATE}/lock; "
            "wait for it and rerun (nothing changed)"
        )
    if code == _MISMATCH:
        raise IntegrityError(f"{t.name}: {msg}; the upload was corrupted, live file untouched: rerun")
    if code == _NOLOAD:
        raise DeployError(f"{t.name}: {msg}; live file untouched: fix the build (vgpu-patch check)")
    if code == _VERIFY:
        raise IntegrityError(f"{t.name}: {msg}; inspect the node and use `vgpu-patch rollback`")
    if code == _UNSAFE:
        raise DeployError(f"{t.name}:{where}: {msg}")
    if code == _WRITE:
        raise DeployError(f"{t.name}:{where}: {msg}; the live file is whole (old or new): see `vgpu-patch status`")
    raise DeployError(f"{t.name}:{where}: the swap script failed with exit {code}: {msg}")


class _Session:
    """A swap's round trips to one node: over one stream where the transport has one (the probe waits,
    script.AWAIT, for the script; the upload follows the script on stdin), else as separate runs."""

    def __init__(self, t: Transport, probe: str) -> None:
        self.t = t
        self.stream = t.open_stream(probe + S.AWAIT, sudo=True, timeout=300)
        self.probe_out = (self.stream.read_until(S.PROBE_END) if self.stream is not None
                          else t.run(probe, sudo=True, timeout=120).stdout)
        self.streamed = self.stream is not None

    def run_script(self, script: str, payload: Path | None = None,
                   on_received: Callable[[str], None] | None = None) -> Result:
        if self.stream is None:
            return self.t.run(script, sudo=True, warn=True, timeout=300)
        stream, self.stream = self.stream, None
        body = (script + S.SCRIPT_END + "\n").encode()
        try:
            stream.send(f"@@go {len(body)}\n".encode() + body)
            if payload is not None:
                with open(payload, "rb") as f:
                    while chunk := f.read(1 << 16):
                        stream.send(chunk)
            if on_received is not None:  # the test seam: the script names the file it received, and waits
                on_received(stream.read_until(S.RECEIVED).splitlines()[-2])
                stream.send(b"\n")
        except VgpuPatchError:
            with contextlib.suppress(VgpuPatchError):  # the script stopped reading: it failed, and says why
                res = stream.finish()
                if not res.ok:
                    return res
            raise
        return stream.finish()

    def end(self) -> None:
        """Nothing (more) to run: the waiting probe reads EOF and exits."""
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):  # a link that is already gone has nothing to end
                stream.finish()


def _parse_swap(t: Transport, res: Result, where: str) -> tuple[str, list[F.MappedLib], str | None, int, str | None]:
    if not res.ok:
        _raise_for(t, res.exited, res.stdout + "\n" + res.stderr, where)
    out = res.stdout
    if "@@noop" in out:
        return "noop", [], None, 0, None
    line = next((ln for ln in out.splitlines() if ln.startswith("@@ok\t")), None)
    if line is None:
        raise DeployError(f"{t.name}:{where}: the swap script ended without a result; check `vgpu-patch status`")
    _, cur, bk, ino = line.split("\t")  # tabs: a backup path may hold spaces
    maps_part = out.split("@@vgpu maps", 1)[1] if "@@vgpu maps" in out else ""
    mapped = F.parse_maps([ln for ln in maps_part.splitlines() if ln.strip()])
    return "ok", mapped, (None if bk == "-" else bk), (-1 if ino == "-" else int(ino)), (None if cur == "-" else cur)


def _node_path(t: Transport, real: str | None, node_dir: str) -> str | None:
    if real is None:
        return None
    real_dir = t.path(node_dir)
    return node_dir + real[len(real_dir):] if real.startswith(real_dir) else real


def _stale(mapped: list[F.MappedLib], inode: int) -> list[int]:
    return sorted({m.pid for m in mapped if m.deleted or m.inode != inode})


def _checkpoint(t: Transport, should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise StopRequested(f"{t.name}: not changed: the rollout is stopping (its failure budget is spent)")


def _refuse_unsafe_state(t: Transport, facts: F.NodeFacts) -> None:
    if facts.state_problem:
        raise DeployError(f"{t.name}:{facts.target_dir}: {facts.state_problem}")


def deploy_file(
    t: Transport,
    source: Path | str,
    target_dir: str = DEFAULT_DIR,
    *,
    operator: str,
    tool: str = DEFAULT_TOOL,
    dry_run: bool = False,
    install: bool = False,
    action: str = "deploy",
    check: bool = False,
    hooks: SwapHooks | None = None,
    should_stop: Callable[[], bool] | None = None,
    stale: bool = False,
) -> SwapResult:
    """Swap `source` in as the node's live library: `swap()` with a request for it (see SwapRequest)."""
    return swap(t, SwapRequest(operator=operator, action=action, candidate=inspect(source), target_dir=target_dir,
                               tool=tool, install=install, check=check, stale=stale, dry_run=dry_run, hooks=hooks,
                               should_stop=should_stop))


def swap(t: Transport, req: SwapRequest, *, judge: Judge | None = None) -> SwapResult:
    """Carry out `req` on one node (see the module docstring for the guarantees): one probe, then the swap.

    `stale=True` also lists the processes still mapping the old library (`stale_pids`), at the cost of
    reading every process's maps on the node. `check=True` also runs `vgpu-patch check` on the candidate
    against the live file (fetched once per distinct vendor sha256) and refuses on a blocking problem.
    `should_stop` is asked before anything is sent (and, over SFTP, again between the upload and the swap):
    when it says yes, the node is left untouched (StopRequested). `judge` sees the probe's facts first and
    returns the request to carry out, or None to change nothing (the agent: one probe per repair).
    """
    node_dir = req.node_dir
    history = F.ALL_HISTORY if judge is not None else 20
    to = (req.to_sha256 or "previous") if req.action == "rollback" else None  # node.sh choose_backup decides
    session = _Session(t, F.probe_script(t.path(node_dir), history=history, maps=False, rollback_to=to))
    try:
        facts = F.from_probe(t, session.probe_out, node_dir, maps=False)
        _refuse_unsafe_state(t, facts)
        live = F.choose_live(facts, t.name)
        if judge is not None:
            chosen = judge(facts, live)
            if chosen is None:
                path, sha = (live.path, live.sha256) if live else (f"{node_dir}/{F.LIB}", None)
                return SwapResult(t.name, "none", False, path, sha, sha or "", plan=[Step("noop", "nothing to do")])
            req = chosen
        if req.action == "rollback":
            return _rollback(t, session, facts, live, req)
        return _deploy(t, session, facts, live, req)
    finally:
        session.end()


def _deploy(t: Transport, session: _Session, facts: F.NodeFacts, live: F.LibFile | None,
            req: SwapRequest) -> SwapResult:
    cand, node_dir, hooks = req.candidate, req.node_dir, req.hooks
    if cand is None:
        raise UsageError(f"{t.name}: a {req.action} needs a candidate library")
    live_path = live.path if live else f"{node_dir}/{F.LIB}"
    preflight(facts, cand, t.name, live, install=req.install)
    upload = f"{UPLOAD_DIR}/.vgpu-patch-upload-{cand.sha256[:12]}-{secrets.token_hex(6)}"  # SFTP only
    after_upload = hooks.after_upload if hooks else None
    plan = list(plan_swap(
        facts, live, live_path, cand.sha256, req, source=cand.path.name,
        receive=cand.size if session.streamed else None,
        params=_params(t, req, live_path, cand.sha256, up=None if session.streamed else t.path(upload), src=None,
                       updir=t.path(UPLOAD_DIR)),
    ))
    result = SwapResult(t.name, req.action, False, live_path, live.sha256 if live else None, cand.sha256, plan=plan)
    if plan[0].kind == "noop":
        return result
    if req.check:
        from .compat import check_against_live

        result.plan.insert(0, Step("verify", check_against_live(t, cand, live)))
    if req.dry_run:
        result.pending = True
        return result
    _checkpoint(t, req.should_stop)
    if not session.streamed:
        try:
            t.put(cand.path, upload)
            if after_upload:
                after_upload(t.path(upload))
            _checkpoint(t, req.should_stop)
        except BaseException:
            _remove_upload(t, upload, redial=True)  # a partial or unused upload: nothing else will remove it
            raise
    hook = after_upload if session.streamed else None
    try:
        res = session.run_script(S.script([st.sh for st in plan], with_program=not session.streamed),
                                 cand.path if session.streamed else None, hook)
    except BaseException:
        # the script removes its temp files itself, and may still be running orphaned (it finishes a swap
        # it started, or fails the sha256 check of an upload cut short): only an SFTP upload over an
        # intact link is removed here
        if not session.streamed and _alive(t):
            _remove_upload(t, upload, redial=False)
        raise
    state, mapped, bk, ino, replaced = _parse_swap(t, res, node_dir)
    if state == "noop":
        result.plan = [Step("noop", f"{live_path} reached sha256 {cand.sha256[:12]} meanwhile: nothing to do")]
        return result
    result.changed, result.backup = True, _node_path(t, bk, node_dir)
    result.from_sha256 = replaced  # what the node really had under the lock
    result.stale_pids = _stale(mapped, ino)
    return result


def _remove_upload(t: Transport, upload: str, *, redial: bool) -> None:
    """Best effort, never masking the real failure: over a dropped link, one quick re-dial to remove it."""
    with contextlib.suppress(Exception):  # never mask the real failure with a cleanup one
        if not _alive(t):
            if not redial:
                return
            quick = getattr(t, "redial_quickly", None)
            if callable(quick):
                quick()
        # as root: a streamed upload is root's (an SFTP one is the login user's, which root removes too)
        t.run(f"rm -f {shlex.quote(t.path(upload))}", sudo=True, warn=True, timeout=15)


def _alive(t: Transport) -> bool:
    """Whether the transport's link is still up (a dropped SSH link needs a re-dial first)."""
    alive = getattr(t, "_alive", None)
    return alive() if callable(alive) else True


def rollback(
    t: Transport,
    target_dir: str = DEFAULT_DIR,
    *,
    to_sha256: str | None = None,
    operator: str,
    tool: str = DEFAULT_TOOL,
    dry_run: bool = False,
    hooks: SwapHooks | None = None,
    should_stop: Callable[[], bool] | None = None,
    stale: bool = False,
) -> SwapResult:
    """Restore a recorded backup the same atomic way, verified by sha256 and byte for byte: `swap()` with a
    rollback request."""
    return swap(t, SwapRequest(operator=operator, action="rollback", to_sha256=to_sha256, target_dir=target_dir,
                               tool=tool, stale=stale, dry_run=dry_run, hooks=hooks, should_stop=should_stop))


def _rollback(t: Transport, session: _Session, facts: F.NodeFacts, live: F.LibFile | None,
              req: SwapRequest) -> SwapResult:
    node_dir = req.node_dir
    backup = F.chosen_backup(facts, t.name)
    want = str(backup["sha256"])
    live_path = live.path if live else str(backup.get("path") or f"{node_dir}/{F.LIB}")
    if not live_path.startswith(node_dir + "/"):
        live_path = f"{node_dir}/{F.LIB}"
    src_node = f"{node_dir}/{F.STATE}/backups/{want}.so"
    plan = list(plan_swap(
        facts, live, live_path, want, req, source=src_node,
        params=_params(t, req, live_path, want, up=None, src=t.path(src_node), updir=t.path(UPLOAD_DIR)),
    ))
    result = SwapResult(t.name, "rollback", False, live_path, live.sha256 if live else None, want, plan=plan)
    if plan[0].kind == "noop" or req.dry_run:
        result.pending = plan[0].kind != "noop"
        return result
    _checkpoint(t, req.should_stop)
    sent = S.script([st.sh for st in plan], with_program=not session.streamed)
    state, mapped, bk, ino, replaced = _parse_swap(t, session.run_script(sent), node_dir)
    if state == "noop":
        return result
    result.changed, result.backup = True, _node_path(t, bk, node_dir)
    result.from_sha256 = replaced  # what the node really had under the lock
    result.stale_pids = _stale(mapped, ino)
    return result


def node_status(t: Transport, target_dir: str = DEFAULT_DIR, *, history: int = 5) -> NodeStatus:
    """Live file, ours or vendor, backups, recent history and processes still mapping an older inode."""
    node_dir = target_dir.rstrip("/") or "/"
    facts = F.gather(t, node_dir, history=history, maps=True)
    problem = None
    try:
        live = F.choose_live(facts, t.name)
    except DeployError as e:  # an ambiguous directory: report it with the rest
        live, problem = None, str(e)
    by_plugin = F.delivered_by_plugin(facts, live)
    last = None if by_plugin else F.replaced_outside(facts.history, live)
    if last is not None and live is not None:
        build = f"ours {live.ours_version}" if live.ours_version else "not ours"
        problem = problem or (
            f"{F.COPY_BACK}: {live.name} is {live.sha256[:12]} ({build}), but the last recorded change ({last.get('action')} by {last.get('tool')}, {last.get('time')}) set "
            f"{str(last['to_sha256'])[:12]}; {F.COPY_BACK_HINT}")
    return NodeStatus(
        node=t.name,
        target_dir=node_dir,
        path=live.path if live else None,
        sha256=live.sha256 if live else None,
        ours=bool(live and live.ours_version),
        version=live.ours_version if live else None,
        size=live.size if live else None,
        backups=[b for b in facts.backups if b.get("present")],
        history=facts.history[-history:] if history else [],
        stale_pids=facts.stale_pids(live) if live else sorted({m.pid for m in facts.mapped}),
        arch=facts.arch,
        glibc=".".join(map(str, facts.glibc)) if facts.glibc else None,
        problem=facts.state_problem or problem or (None if live else f"no {F.LIB} in {node_dir}"),
        warnings=facts.warnings,
        live_why=facts.live_why if live else "",
        replaced_outside=last is not None,
        delivered_by_plugin=by_plugin,
        other_files=F.other_files(facts),
        signer=facts.signer(live.sha256) if live else None,
        state_unsafe=facts.state_problem is not None,
    )


__all__ = ["Candidate", "NodeStatus", "SwapResult", "deploy_file", "node_status", "rollback", "swap"]
