"""The swap protocol of docs/node-state.md: deploy_file, rollback and node_status over any Transport.

Round trips per changed node: one privileged probe (facts), one upload, one privileged swap script that
takes the lock, verifies, backs up, swaps atomically, re-verifies and records. Every check the script makes
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

from .. import __version__
from ..errors import DeployError, IntegrityError, LockedError, UsageError
from ..transport.base import Transport, first_line
from . import facts as F
from .candidate import Candidate, inspect
from .ops import Step, plan_swap, preflight

DEFAULT_DIR = "/usr/local/vgpu"
DEFAULT_TOOL = f"vgpu-patch {__version__}"

# exit codes of the swap script
_LOCKED, _MISMATCH, _NOLOAD, _VERIFY, _WRITE = 75, 65, 66, 68, 71


@dataclass
class SwapHooks:
    """Test seams: `after_upload(real_path)` runs between upload and the swap; `in_lock` is sh run holding the lock."""

    after_upload: Callable[[str], None] | None = None
    in_lock: str = ""


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
        d["plan"] = [s.text for s in self.plan]
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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Shell:
    """A JSON value the swap script computes itself: a shell variable already holding JSON."""

    var: str


def _printf_json(doc: dict) -> str:
    """A `printf` command writing `doc` as one JSON line, _Shell values filled in on the node."""
    parts, args = [], []
    for key, value in doc.items():
        if isinstance(value, _Shell):
            parts.append(f"{json.dumps(key)}: %s")
            args.append(f'"${value.var}"')
        else:  # a literal: escape what printf would interpret in its format
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}".replace("\\", "\\\\").replace("%", "%%"))
    fmt = "{" + ", ".join(parts) + "}\\n"
    return "printf " + shlex.quote(fmt) + "".join(" " + a for a in args)


# computed by the script: NOWJ (its clock), CURJ/FROMJ (the file it replaced, or null), SIZE
_NOW, _CUR, _FROM, _SIZE = _Shell("NOWJ"), _Shell("CURJ"), _Shell("FROMJ"), _Shell("SIZE")


def _history_printf(action: str, live_path: str, want: str, operator: str, tool: str) -> str:
    return _printf_json({"time": _NOW, "action": action, "path": live_path, "from_sha256": _FROM,
                         "to_sha256": want, "operator": operator, "tool": tool})


def _manifest_printf(live_path: str, operator: str, tool: str) -> str:
    """backups/<sha256>.json (docs/node-state.md) for the file actually copied aside."""
    return _printf_json({"sha256": _CUR, "size": _SIZE, "path": live_path, "saved_at": _NOW,
                         "operator": operator, "tool": tool})


def _swap_script(
    *,
    real_dir: str,
    live_real: str,
    want: str,
    upload_real: str | None,
    source_real: str | None,
    history_printf: str,
    manifest_printf: str,
    byte_compare: bool,
    in_lock: str = "",
) -> str:
    q = shlex.quote
    name = live_real.rsplit("/", 1)[1]
    return f"""
D={q(real_dir)}; S="$D/{F.STATE}"; LIVE={q(live_real)}; WANT={q(want)}
UP={q(upload_real or '')}; SRC={q(source_real or '')}
NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ); NOWJ="\\"$NOW\\""
STG="$S/staging/$WANT.so"; TMP="$D/.{name}.vgpu-patch-tmp.$$"; BTMP=""; LOCKDIR=""
trap '' HUP PIPE  # a dropped connection must not stop a swap half-way: finish it
HELD=""
cleanup() {{
  rm -f "$TMP" "$STG.part.$$" ${{BTMP:+"$BTMP"}} ${{BTMP:+"$BTMP.json"}} ${{UP:+"$UP"}}
  [ -n "$HELD" ] && [ -n "$UP" ] && rm -f "$STG"   # our staged copy; only touched while holding the lock
  [ -n "$LOCKDIR" ] && rmdir "$LOCKDIR"
}}
trap cleanup EXIT
fail() {{ code=$1; shift; printf '@@err %s\\n' "$*"; exit "$code"; }}
hash_of() {{ sha256sum < "$1" | cut -c1-64; }}
# a whole 64-bit ELF: magic, and its section headers (at the end) inside the file; a cp caught mid-copy is not
whole_lib() {{
  [ "$2" -gt 64 ] || return 1
  command -v od >/dev/null 2>&1 || return 0  # no od: a non-empty file counts as whole
  [ "$(od -An -N4 -tx1 "$1" | tr -d ' \n')" = 7f454c46 ] || return 1
  set -- "$2" $(od -An -j40 -N8 -tu8 "$1" 2>/dev/null) $(od -An -j58 -N4 -tu2 "$1" 2>/dev/null)
  [ $# -eq 4 ] || return 0  # an od without 8-byte integers: the magic has to do
  [ $(( $2 + $3 * $4 )) -le "$1" ]
}}
umask 022
mkdir -p "$S/backups" "$S/staging" || fail {_WRITE} "cannot create $S"
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$S/lock" || fail {_WRITE} "cannot open $S/lock"
  flock -n 9 || fail {_LOCKED} "locked"
else
  mkdir "$S/lock.d" 2>/dev/null || fail {_LOCKED} "locked"; LOCKDIR="$S/lock.d"
fi
HELD=1
# temp files of a swap that was SIGKILLed: only a lock holder makes them, so any found now are orphans
rm -f "$D"/.*.vgpu-patch-tmp.* "$S"/staging/*.part.* "$S"/backups/.*.tmp.*
{in_lock}
if [ -n "$UP" ]; then
  # no fsync: a staged copy is re-verified by hash below and simply re-uploaded after a crash
  cp "$UP" "$STG.part.$$" 2>&1 && mv -f "$STG.part.$$" "$STG" \\
    || fail {_WRITE} "copying the upload to $S/staging failed (disk full?)"
  rm -f "$UP"; SRC="$STG"
fi
got=$(hash_of "$SRC")
if [ "$got" != "$WANT" ]; then
  [ -n "$UP" ] && rm -f "$STG"
  fail {_MISMATCH} "sha256 of $SRC is $got, expected $WANT"
fi
cur=""; [ -e "$LIVE" ] && cur=$(hash_of "$LIVE")
if [ "$cur" = "$WANT" ]; then [ -n "$UP" ] && rm -f "$STG"; echo "@@noop"; exit 0; fi
out=$(LD_PRELOAD="$SRC" /bin/true 2>&1); rc=$?
case "$out" in *"cannot be preloaded"*|*"ERROR: ld.so"*) rc=127;; esac
[ "$rc" -eq 0 ] || fail {_NOLOAD} "LD_PRELOAD of the new file made /bin/true fail (exit $rc): $(printf '%s' "$out" | head -n 1)"
# Back up what is live now (it may differ from the plan: HAMi's plugin rewrites the file in place,
# outside any lock). The copy is hashed, so the backup's name and the history say what was replaced.
# A live file that is not a whole library (empty, or caught mid-copy) is replaced but never kept as a backup
# nor recorded as from_sha256: a rollback must never restore it.
BK=""; FROMJ=null; REC=""
if [ -e "$LIVE" ]; then
  BTMP="$S/backups/.live.tmp.$$"
  cp "$LIVE" "$BTMP" 2>&1 && chmod 0644 "$BTMP" || fail {_WRITE} "backing up $LIVE failed (disk full?)"
  cur=$(hash_of "$BTMP"); SIZE=$(stat -c %s "$BTMP"); CURJ="\\"$cur\\""; FROMJ="$CURJ"; REC="$cur"
  BK="$S/backups/$cur.so"
  if ! whole_lib "$BTMP" "$SIZE"; then
    rm -f "$BTMP"; BK=""; FROMJ=null; REC=""
    printf '@@partial %s\\n' "$SIZE"
  elif [ -f "$BK" ] && [ "$(hash_of "$BK")" = "$cur" ]; then
    rm -f "$BTMP"
  else
    {manifest_printf} > "$BTMP.json" || fail {_WRITE} "writing the backup manifest failed (disk full?)"
    sync "$BTMP" "$BTMP.json" 2>/dev/null || sync
    mv -f "$BTMP" "$BK" && mv -f "$BTMP.json" "$S/backups/$cur.json" || fail {_WRITE} "storing the backup failed"
  fi
  BTMP=""
fi
cp "$SRC" "$TMP" 2>&1 || fail {_WRITE} "writing $TMP failed (disk full?)"
if [ -n "$cur" ]; then
  chmod --reference="$LIVE" "$TMP" 2>/dev/null || chmod 0644 "$TMP"
  [ "$(id -u)" = 0 ] && chown --reference="$LIVE" "$TMP" 2>/dev/null
  if [ -e /sys/fs/selinux/enforce ] && command -v chcon >/dev/null 2>&1; then chcon --reference="$LIVE" "$TMP" 2>/dev/null; fi
else
  chmod 0644 "$TMP"
fi
sync "$TMP" "$S/backups" 2>/dev/null || sync  # the new file's bytes and the backup's name, before the rename
out=$(mv -f "$TMP" "$LIVE" 2>&1) || fail {_WRITE} "renaming $TMP over $LIVE failed ($out; EBUSY: $LIVE is a mount point, act on the host file)"
got=$(hash_of "$LIVE")
[ "$got" = "$WANT" ] || fail {_VERIFY} "after the swap $LIVE has sha256 $got, expected $WANT"
{'if command -v cmp >/dev/null 2>&1; then cmp -s "$SRC" "$LIVE" || fail ' + str(_VERIFY) + ' "$LIVE differs from $SRC byte for byte"; fi' if byte_compare else ''}
{history_printf} >> "$S/history.jsonl" \\
  || fail {_WRITE} "the swap is done but appending to $S/history.jsonl failed (disk full?)"
sync "$D" "$S/history.jsonl" 2>/dev/null || sync  # the rename (directory) and the record
[ -n "$UP" ] && rm -f "$STG"
# uploads orphaned by a dropped connection (this one is gone already): older than a day
[ -n "$UP" ] && command -v find >/dev/null 2>&1 && find "${{UP%/*}}" -maxdepth 1 -name '.vgpu-patch-upload-*' -mtime +0 -exec rm -f {{}} + 2>/dev/null
printf '@@ok %s %s %s\\n' "${{REC:--}}" "${{BK:--}}" "$(stat -c %i "$LIVE")"
printf '\\n@@vgpu maps\\n'
{F.maps_snippet()}
exit 0
"""


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
    if code == _WRITE:
        raise DeployError(f"{t.name}:{where}: {msg}; the live file is whole (old or new): see `vgpu-patch status`")
    raise DeployError(f"{t.name}:{where}: the swap script failed with exit {code}: {msg}")


def _run_swap(t: Transport, script: str, where: str) -> tuple[str, list[F.MappedLib], str | None, int, str | None]:
    res = t.run(script, sudo=True, warn=True, timeout=300)
    if not res.ok:
        _raise_for(t, res.exited, res.stdout + "\n" + res.stderr, where)
    out = res.stdout
    if "@@noop" in out:
        return "noop", [], None, 0, None
    line = next((ln for ln in out.splitlines() if ln.startswith("@@ok ")), None)
    if line is None:
        raise DeployError(f"{t.name}:{where}: the swap script ended without a result; check `vgpu-patch status`")
    _, cur, bk, ino = line.split()
    maps_part = out.split("@@vgpu maps", 1)[1] if "@@vgpu maps" in out else ""
    mapped = F.parse_maps([ln for ln in maps_part.splitlines() if ln.strip()])
    return "ok", mapped, (None if bk == "-" else bk), int(ino), (None if cur == "-" else cur)


def _node_path(t: Transport, real: str | None, node_dir: str) -> str | None:
    if real is None:
        return None
    real_dir = t.path(node_dir)
    return node_dir + real[len(real_dir):] if real.startswith(real_dir) else real


def _stale(mapped: list[F.MappedLib], inode: int) -> list[int]:
    return sorted({m.pid for m in mapped if m.deleted or m.inode != inode})


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
) -> SwapResult:
    """Swap `source` in as the node's live library (see the module docstring for the guarantees).

    `check=True` also runs `vgpu-patch check` on `source` against the live file (fetched once per
    distinct vendor sha256) and refuses on a blocking problem.
    """
    cand = inspect(source)
    node_dir = target_dir.rstrip("/") or "/"
    facts = F.gather(t, node_dir, maps=False)
    live = F.choose_live(facts, t.name)
    live_path = live.path if live else f"{node_dir}/{F.LIB}"
    preflight(facts, cand, t.name, live, install=install)
    plan = list(plan_swap(facts, live, live_path, cand.sha256, source=cand.path.name, upload=True))
    result = SwapResult(t.name, action, False, live_path, live.sha256 if live else None, cand.sha256, plan=plan)
    if plan[0].kind == "noop":
        return result
    if check:
        from .compat import check_against_live

        result.plan.insert(0, Step("verify", check_against_live(t, cand, live)))
    if dry_run:
        result.pending = True
        return result
    upload = f"/tmp/.vgpu-patch-upload-{cand.sha256[:12]}-{secrets.token_hex(6)}"
    script = _swap_script(
        real_dir=t.path(node_dir), live_real=t.path(live_path), want=cand.sha256,
        upload_real=t.path(upload), source_real=None,
        history_printf=_history_printf(action, live_path, cand.sha256, operator, tool),
        manifest_printf=_manifest_printf(live_path, operator, tool),
        byte_compare=False, in_lock=hooks.in_lock if hooks else "",
    )
    try:
        t.put(cand.path, upload)
        if hooks and hooks.after_upload:
            hooks.after_upload(t.path(upload))
        state, mapped, bk, ino, replaced = _run_swap(t, script, node_dir)
    except BaseException:
        if _alive(t):  # the script removes the upload itself; this covers failures before it ran
            with contextlib.suppress(Exception):  # never mask the real failure with a cleanup one
                t.run(f"rm -f {shlex.quote(t.path(upload))}", sudo=True, warn=True, timeout=30)
        raise
    if state == "noop":
        result.plan = [Step("noop", f"{live_path} reached sha256 {cand.sha256[:12]} meanwhile: nothing to do")]
        return result
    result.changed, result.backup = True, _node_path(t, bk, node_dir)
    result.from_sha256 = replaced  # what the node really had under the lock
    result.stale_pids = _stale(mapped, ino)
    return result


def _alive(t: Transport) -> bool:
    """Whether a cleanup command is worth trying (an SSH link that dropped is not re-dialled for it)."""
    alive = getattr(t, "_alive", None)
    return alive() if callable(alive) else True


def choose_backup(facts: F.NodeFacts, live: F.LibFile | None, to_sha256: str | None, node: str) -> dict:
    """The backup to restore: the one named (a unique prefix of 6+ hex is fine), else the previous file."""
    # never restore a backup that is not a whole library (older versions kept empty files caught mid-copy)
    present = [b for b in facts.backups if b.get("present") and int(b.get("size") or 0) > 64]
    if to_sha256:
        want = to_sha256.lower()
        if len(want) < 6:
            raise UsageError(f"--to {to_sha256}: give at least 6 hex digits of a backup's sha256")
        hits = [b for b in present if str(b.get("sha256", "")).startswith(want)]
        if len(hits) != 1:
            known = ", ".join(str(b["sha256"])[:12] for b in present) or "none"
            raise DeployError(
                f"{node}:{facts.target_dir}: {'no' if not hits else 'several'} backups match {to_sha256} "
                f"(kept: {known}); see `vgpu-patch status`"
            )
        return hits[0]
    if live is not None:
        for entry in reversed(facts.history):
            if entry.get("to_sha256") == live.sha256 and entry.get("from_sha256"):
                b = facts.backup(entry["from_sha256"])
                if b is not None and b in present:
                    return b
    others = [b for b in present if live is None or b.get("sha256") != live.sha256]
    if not others:
        raise DeployError(f"{node}:{facts.target_dir}: no backup to roll back to; nothing was changed")
    return others[-1]


def rollback(
    t: Transport,
    target_dir: str = DEFAULT_DIR,
    *,
    to_sha256: str | None = None,
    operator: str,
    tool: str = DEFAULT_TOOL,
    dry_run: bool = False,
    hooks: SwapHooks | None = None,
) -> SwapResult:
    """Restore a recorded backup the same atomic way, verified by sha256 and byte for byte."""
    node_dir = target_dir.rstrip("/") or "/"
    facts = F.gather(t, node_dir, maps=False)
    live = F.choose_live(facts, t.name)
    backup = choose_backup(facts, live, to_sha256, t.name)
    want = str(backup["sha256"])
    live_path = live.path if live else str(backup.get("path") or f"{node_dir}/{F.LIB}")
    if not live_path.startswith(node_dir + "/"):
        live_path = f"{node_dir}/{F.LIB}"
    src_node = f"{node_dir}/{F.STATE}/backups/{want}.so"
    plan = list(plan_swap(facts, live, live_path, want, source=src_node, upload=False))
    result = SwapResult(t.name, "rollback", False, live_path, live.sha256 if live else None, want, plan=plan)
    if plan[0].kind == "noop" or dry_run:
        result.pending = plan[0].kind != "noop"
        return result
    script = _swap_script(
        real_dir=t.path(node_dir), live_real=t.path(live_path), want=want,
        upload_real=None, source_real=t.path(src_node),
        history_printf=_history_printf("rollback", live_path, want, operator, tool),
        manifest_printf=_manifest_printf(live_path, operator, tool), byte_compare=True,
        in_lock=hooks.in_lock if hooks else "",
    )
    state, mapped, bk, ino, replaced = _run_swap(t, script, node_dir)
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
        problem=problem or (None if live else f"no {F.LIB} in {node_dir}"),
    )


__all__ = ["Candidate", "NodeStatus", "SwapHooks", "SwapResult", "deploy_file", "node_status", "rollback"]
