"""The agent's loop: install the image's library, then watch and repair with the CLI's swap protocol.

Rules (docs/fleet.md):
- At start (and with --once) the live file is made the image's library: history action `deploy`, or
  `reapply` when the newest record already named it (an unrecorded writer replaced it since).
- While running, a replacement that no tool recorded (HAMi's device plugin copying its file back) is
  reverted (`reapply`). A replacement that *was* recorded (an operator's `vgpu-patch rollback`, a CLI or
  Ansible deploy) is respected: the agent stops enforcing ("yielded", not ready) until it restarts.
"""
from __future__ import annotations

import copy
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..deploy import facts as F
from ..deploy.request import SwapRequest
from ..deploy.swap import SwapResult, rollback, swap
from ..report.errors import DeployError, IntegrityError, VgpuPatchError
from ..transport.local import LocalTransport
from .image import ImageLibrary, expected_sha256, verify_image
from .policy import decide
from .status import AgentStatus, utc_now, write_ready_marker, write_status
from .watcher import PollWatcher, make_watcher, relevant

if TYPE_CHECKING:
    from ..k8s.report import NodeReporter

TOOL = "agent"
RETRY_FIRST = 0.5  # seconds before the first retry of a failed check; doubled up to the interval


def log(msg: str) -> None:
    print(f"{utc_now()} vgpu-patch agent: {msg}", file=sys.stderr, flush=True)


def default_operator() -> str:
    # NODE_NAME comes from the DaemonSet's downward API; the pod's hostname is the pod name.
    return f"agent@{os.environ.get('NODE_NAME') or socket.gethostname()}"


@dataclass
class AgentConfig:
    library: Path
    host_root: Path = Path("/host")
    target_dir: str = "/usr/local/vgpu"
    interval: float = 10.0
    sha256: str | None = None
    manifest: Path | None = None
    allowed_signers: Path | None = None  # refuse an image library not signed by one of these keys
    status_file: Path | None = None
    operator: str = ""
    watch: str = "auto"  # auto | inotify | poll
    settle: float = 0.3  # wait for another writer to finish before judging its file
    proc: Path | None = Path("/proc")  # the host's /proc (hostPID): stale processes and their pods; None = off
    ready_file: Path | None = None  # exists only while ready (exec probe `test -e`); default: `ready` by status_file
    stuck_after: float = 0.0  # liveness fails when the loop has not turned for this long; 0 = max(120, 3*interval+60)
    reporter: NodeReporter | None = None  # node annotations through the API (optional service account)

    @property
    def stuck_seconds(self) -> float:
        return self.stuck_after or max(120.0, 3 * self.interval + 60.0)


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.image: ImageLibrary = verify_image(cfg.library, sha256=cfg.sha256, manifest=cfg.manifest,
                                                allowed_signers=cfg.allowed_signers)
        if self.image.signature is not None:
            log(f"{cfg.library}: signed by {self.image.signature.signer}")
        if self.image.provenance is not None:
            log(f"{cfg.library}: {self.image.provenance}, as signed by {self.image.provenance.signer}")
        self.operator = cfg.operator or default_operator()
        self.t = LocalTransport(cfg.host_root, name=self.operator.split("@", 1)[-1])
        self.dir = cfg.target_dir.rstrip("/") or "/"
        # built once: the image's library, inspected once at start, installed wherever nothing is
        self.request = SwapRequest(operator=self.operator, action="deploy", candidate=self.image.candidate,
                                   target_dir=self.dir, tool=TOOL, install=True, signature=self.image.signature)
        self.host_dir = Path(self.t.path(self.dir))
        self.status = AgentStatus(
            node=self.t.name, library=str(cfg.library), want_sha256=self.image.sha256, target_dir=self.dir,
            provenance=self.image.provenance.to_dict() if self.image.provenance else None,
        )
        if cfg.ready_file is None and cfg.status_file is not None:
            cfg.ready_file = cfg.status_file.with_name("ready")
        self.status.api = "ok" if cfg.reporter is not None else "off"
        self.status.heartbeat_unix = time.time()  # a first check that never returns must also fail liveness
        self._stop = threading.Event()
        self._watcher: PollWatcher | None = None
        self._good_sig: tuple | None = None
        self._lock = threading.Lock()
        self._published: AgentStatus = copy.deepcopy(self.status)
        self._partial_logged: str | None = None
        self._stale_pods: list = []  # StalePod of the last scan
        self._guard_logged: str | None = None

    # -- one pass ---------------------------------------------------------------------------------
    def signature(self) -> tuple | None:
        """(name, inode, size, mtime) of the library files: tells when a writer has finished (see _settled)."""
        try:
            with os.scandir(self.host_dir) as it:
                entries = sorted(
                    (e.name, st.st_ino, st.st_size, st.st_mtime_ns)
                    for e in it
                    if relevant(e.name) and not e.is_dir(follow_symlinks=False)
                    for st in [e.stat(follow_symlinks=False)]
                )
        except OSError:  # missing or unreadable for now: the check itself says why
            return None
        return tuple(entries)

    def ensure(self, *, startup: bool) -> str:
        """Look at the live file and act (one probe: the swap's own); returns ok | deploy | reapply | yielded."""
        s = self.status
        sig = self.signature()  # taken before hashing: a change after it shows up as a new signature
        did = "ok"
        seen: list[F.NodeFacts] = []

        def judge(facts: F.NodeFacts, live: F.LibFile | None) -> SwapRequest | None:
            nonlocal did
            s.checks += 1
            s.last_check, s.last_check_unix = utc_now(), time.time()
            s.live_path, s.live_sha256 = (live.path, live.sha256) if live else (None, None)
            s.live_signer = facts.signer(live.sha256) if live else None
            seen.append(facts)
            last = F.last_change(facts.history)
            decision = decide(live.sha256 if live else None, self.image.sha256, last, startup=startup,
                              yielded=s.state == "yielded")
            did = decision.action
            if decision.action == "ok":
                s.state, s.yielded_to = "ok", None  # also ends a yield: someone put our library back
                self._good_sig = sig
                return None
            if decision.action == "yielded":
                return None
            if decision.action == "yield":
                did, s.state, s.yielded_to = "yielded", "yielded", last
                log(f"{s.live_path} was changed to {(s.live_sha256 or '')[:12]} by {(last or {}).get('tool')} "
                    f"({(last or {}).get('operator')}, {(last or {}).get('action')}): respecting it and no longer "
                    "enforcing; restart the agent to enforce again")
                return None
            if decision.copy_back:
                s.copy_backs += 1
                log(f"{live.path if live else self.dir} {F.COPY_BACK}: it differs from the last recorded change; "
                    f"putting the image's library back; {F.FIX_BY_IMAGE}")
            if live is not None:
                self._note_partial(live)
            return replace(self.request, action=decision.action)

        res = swap(self.t, self.request, judge=judge)
        if did in ("ok", "yielded"):
            return did
        self._record(res, did)
        signed = self.image.signature
        s.live_signer = (signed.signer.to_dict() if signed and res.to_sha256 == self.image.sha256
                         else seen[0].signer(res.to_sha256) if seen else None)
        return did if res.changed else "ok"

    def _note_partial(self, live: F.LibFile) -> None:
        """Say so when the file being replaced is not a whole library; the swap then keeps no backup of it."""
        from ..elf.facts import image
        from ..report.errors import ElfError

        try:
            with image(Path(self.t.path(live.path)), "live library"):
                pass
        except ElfError as e:
            if live.sha256 != self._partial_logged:
                log(f"{e}: replacing it without keeping it as a backup or rollback target")
                self._partial_logged = live.sha256

    def _record(self, res: SwapResult, action: str) -> None:
        s = self.status
        s.live_path, s.live_sha256 = res.path, res.to_sha256
        s.state = "ok"
        self._good_sig = None  # another writer may already have struck since the rename
        if not res.changed:
            return
        if action == "reapply":
            s.reapplies += 1
        else:
            s.deploys += 1
        s.last_change = {"time": utc_now(), "action": action, "path": res.path, "from_sha256": res.from_sha256,
                         "to_sha256": res.to_sha256, "backup": res.backup}
        old = (res.from_sha256 or "nothing")[:12]
        log(f"{action}: {res.path} {old} -> {res.to_sha256[:12]}"
            + (f"; pids still on the old file until restart: {res.stale_pids}" if res.stale_pids else ""))

    def step(self, *, startup: bool = False, raise_errors: bool = False) -> str:
        """ensure() with errors recorded in the status instead of ending the agent; then publish one snapshot."""
        before = (self.status.state, self.status.last_error)
        try:
            did = self.ensure(startup=startup)
            self.status.last_error = None
        except Exception as e:  # any failure, ours or not (EMFILE, a bug): recorded, and the loop goes on
            msg = str(e) if isinstance(e, VgpuPatchError) else f"unexpected {type(e).__name__}: {e}"
            self.status.errors += 1
            if msg != self.status.last_error:  # a lasting problem is logged once, counted every time
                log(f"error: {msg}; not ready until it is fixed")
            self.status.state, self.status.last_error = "error", msg
            if raise_errors:
                self.publish()
                if isinstance(e, VgpuPatchError):
                    raise
                raise DeployError(f"{self.t.name}: {msg}") from e
            did = "error"
        except BaseException:
            self.publish()
            raise
        self._guarded(self.scan_stale)  # optional views: their failure never stops the agent either
        self.report()
        self.announce(before)
        self.publish()
        return did

    def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:
            msg = f"{fn.__name__}: unexpected {type(e).__name__}: {e}"
            if msg != self._guard_logged:
                log(f"{msg}; retrying on the next check")
                self._guard_logged = msg

    def announce(self, before: tuple[str, str | None]) -> None:
        """An Event on the Node when the agent starts refusing (error) or yields: loud where operators look."""
        s, rep = self.status, self.cfg.reporter
        if rep is None or (s.state, s.last_error) == before or s.state not in ("error", "yielded"):
            return
        reason = "VgpuPatchRefused" if s.state == "error" else "VgpuPatchYielded"
        try:
            rep.event("Warning" if s.state == "error" else "Normal", reason, f"{s.reason} (not ready)")
        except Exception as e:  # optional, like the annotations
            s.api_errors += 1
            s.api, s.api_error = "error", str(e) if isinstance(e, VgpuPatchError) else f"{type(e).__name__}: {e}"

    def scan_stale(self) -> None:
        """Processes still mapping an older copy of the library, grouped by pod (needs the host's /proc)."""
        if self.cfg.proc is None:
            return
        from ..k8s.procmap import by_pod, scan, scope

        s = self.status
        if not s.stale_scope:
            s.stale_scope = scope(self.cfg.proc)
            if s.stale_scope == "pid-namespace":
                log(f"{self.cfg.proc} shows only this pod's PID namespace (no hostPID): processes of other pods "
                    "still on an old library are not seen; run with hostPID or --no-stale-scan")
        live_ino = None
        if s.live_path:
            try:
                live_ino = os.stat(self.t.path(s.live_path)).st_ino
            except OSError:
                live_ino = None
        procs = scan(self.cfg.proc, (self.dir, str(self.host_dir)), live_ino)
        pods, host_pids = by_pod(procs)
        self._stale_pods = pods
        s.stale_scanned = True
        s.stale_processes = len(procs)
        s.stale_pods = [p.to_dict() for p in pods]
        s.stale_host_pids = host_pids

    def report(self) -> None:
        """Annotate the node (optional service account); an API failure never changes readiness."""
        rep, s = self.cfg.reporter, self.status
        if rep is None:
            return
        try:
            pods = self._stale_pods
            rep.report(s.live_sha256, s.live_path, pods, s.stale_host_pids)
            s.stale_pods = [p.to_dict() for p in pods]  # now with namespace/name
            s.api, s.api_error = "ok", None
        except Exception as e:  # reporting is optional: no failure of it may stop the agent
            msg = str(e) if isinstance(e, VgpuPatchError) else f"{type(e).__name__}: {e}"
            s.api_errors += 1
            if msg != s.api_error:
                log(f"cannot report to the Kubernetes API: {msg}")
            s.api, s.api_error = "error", msg

    def publish(self) -> None:
        """One consistent snapshot for /healthz, /metrics, the status file and the ready marker."""
        self.status.heartbeat_unix = time.time()
        snap = copy.deepcopy(self.status)
        self.write_status(snap)  # files first: whoever sees the new snapshot in memory finds them written
        with self._lock:
            self._published = snap

    def snapshot(self) -> AgentStatus:
        with self._lock:
            return self._published

    def write_status(self, snap: AgentStatus | None = None) -> None:
        snap = snap or self.snapshot()
        if self.cfg.status_file:
            try:
                write_status(self.cfg.status_file, snap)
            except OSError as e:
                log(f"cannot write status file {self.cfg.status_file}: {e.strerror or e}")
        if self.cfg.ready_file:
            try:
                write_ready_marker(self.cfg.ready_file, snap.ready)
            except OSError as e:
                log(f"cannot write ready marker {self.cfg.ready_file}: {e.strerror or e}")

    # -- the loop ---------------------------------------------------------------------------------
    def _settled(self) -> None:
        """Wait until the directory stops changing (a writer mid-copy), at most ~20 settle periods."""
        prev = self.signature()
        for _ in range(20):
            if self._stop.wait(self.cfg.settle):
                return
            cur = self.signature()
            if cur == prev:
                return
            prev = cur

    def run(self, *, once: bool = False) -> AgentStatus:
        """Install, then (unless `once`) watch and repair until stop() is called."""
        if once:
            self.status.watch = "once"
            self.step(startup=True, raise_errors=True)
            return self.status
        self._watcher = make_watcher(self.host_dir, self.cfg.watch)
        self.status.watch = self._watcher.kind
        log(f"watching {self.host_dir} ({self._watcher.kind}, re-check every {self.cfg.interval:g}s); "
            f"image library {self.image.sha256[:12]} ({self.image.version or 'foreign build'})")
        try:
            self.publish()  # "starting": not ready, but alive
            self.step(startup=True)
            startup = self.status.state == "error"  # keep trying the install until it has succeeded once
            failures = int(self.status.state == "error")
            while not self._stop.is_set():
                try:
                    woke = self._watcher.wait(self.next_wait(failures))
                    if self._stop.is_set():
                        break
                    # Every wake-up hashes the live file (a few ms): inode, size and mtime alone can miss an
                    # in-place rewrite within one timestamp tick. An event first waits for the writer to finish.
                    if woke or self.signature() != self._good_sig:
                        self._settled()
                except Exception as e:  # the watch itself failed (EMFILE, EIO): poll from now on, check anyway
                    log(f"watching {self.host_dir}: unexpected {type(e).__name__}: {e}; polling instead")
                    self._watcher.close()
                    self._watcher = PollWatcher(self.host_dir)
                    self.status.watch = self._watcher.kind
                    self._stop.wait(self.next_wait(failures + 1))
                self.step(startup=startup)
                startup = startup and self.status.state == "error"
                failures = failures + 1 if self.status.state == "error" else 0
        finally:
            self._watcher.close()
        return self.status

    def next_wait(self, failures: int) -> float:
        """Seconds until the next check: the interval, or after failures a backoff of 0.5, 1, 2 ... s up to it."""
        wait = min(self.cfg.interval, self.cfg.stuck_seconds / 3)
        return min(wait, RETRY_FIRST * 2 ** (failures - 1)) if failures else wait

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()

    # -- operator actions ---------------------------------------------------------------------------
    def rollback(self, to_sha256: str | None = None) -> SwapResult:
        return rollback(self.t, self.dir, to_sha256=to_sha256, operator=self.operator, tool=TOOL)


def probe(library: Path, host_root: Path, target_dir: str, *, sha256: str | None = None,
          manifest: Path | None = None) -> dict:
    """Readiness: is the live file the image's library? Cheap (no ELF parsing), read-only."""
    try:
        want, _ = expected_sha256(library, sha256, manifest)
    except VgpuPatchError:
        from ..deploy.candidate import sha256_file

        try:
            want = sha256_file(library)  # no manifest: the library itself is the reference
        except OSError as e:
            raise IntegrityError(f"{library}: cannot read the image library ({e.strerror}); check --library") from e
    t = LocalTransport(host_root, name="probe")
    facts = F.gather(t, target_dir.rstrip("/") or "/", history=1, maps=False)
    live = F.choose_live(facts, t.name)
    return {"ready": bool(live and live.sha256 == want), "live_path": live.path if live else None,
            "live_sha256": live.sha256 if live else None, "want_sha256": want}
