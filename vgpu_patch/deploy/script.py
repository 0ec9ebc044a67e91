"""The swap's shell, one fragment per step: the plan (`--dry-run`) and the script that runs are the same list.

Each fragment reads the variables set by `prepare` (D, S, LIVE, WANT, UP, SRC...). `script(steps)` joins
the fragments of a plan in order; nothing else is sent to the node. Every path is a shell variable set
from a `shlex.quote`d literal, so spaces, colons and quotes in paths are safe.
"""
from __future__ import annotations

import json
import shlex
import textwrap
from dataclasses import dataclass

from .facts import LIB, STATE, maps_snippet, node_program

# exit codes of the swap script
LOCKED, MISMATCH, NOLOAD, VERIFY, WRITE, UNSAFE = 75, 65, 66, 68, 71, 77


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


def history_printf(action: str, live_path: str, want: str, operator: str, tool: str) -> str:
    return _printf_json({"time": _NOW, "action": action, "path": live_path, "from_sha256": _FROM,
                         "to_sha256": want, "operator": operator, "tool": tool})


def manifest_printf(live_path: str, operator: str, tool: str) -> str:
    """backups/<sha256>.json (docs/node-state.md) for the file actually copied aside."""
    return _printf_json({"sha256": _CUR, "size": _SIZE, "path": live_path, "saved_at": _NOW,
                         "operator": operator, "tool": tool})


# A whole 64-bit ELF: magic, and its section headers (at the end) inside the file; a cp caught mid-copy
# (HAMi's plugin rewrites the live file in place) is not. `whole_lib FILE SIZE`.
WHOLE_LIB = """whole_lib() {
  [ "$2" -gt 64 ] || return 1
  command -v od >/dev/null 2>&1 || return 0  # no od: a non-empty file counts as whole
  # shellcheck disable=SC2046  # od's 64 byte values are meant to split: byte k is ${k+2}
  set -- "$2" $(od -An -v -N64 -tu1 "$1" 2>/dev/null)
  [ $# -eq 65 ] && [ "$2.$3.$4.$5" = 127.69.76.70 ] || return 1
  if [ "$7" = 2 ]; then  # EI_DATA: big-endian
    o=$(( (${42} << 56) + (${43} << 48) + (${44} << 40) + (${45} << 32) + (${46} << 24) + (${47} << 16) \\
      + (${48} << 8) + ${49} ))
    o=$(( o + ((${60} << 8) + ${61}) * ((${62} << 8) + ${63}) ))
  else
    o=$(( (${49} << 56) + (${48} << 48) + (${47} << 40) + (${46} << 32) + (${45} << 24) + (${44} << 16) \\
      + (${43} << 8) + ${42} ))
    o=$(( o + ((${61} << 8) + ${60}) * ((${63} << 8) + ${62}) ))
  fi
  [ "$o" -le "$1" ]  # e_shoff + e_shentsize * e_shnum: the section headers end inside the file
}"""


# What both prologues (the CLI's and the Ansible role's) define after their parameters: the exit
# cleanup (only what this run created), fail, hash_of, whole_lib and $ME.
RUNTIME = f"""trap '' HUP PIPE  # a dropped connection must not stop a swap half-way: finish it
NL='
'
rmx() {{  # rm -f what of "$@" exists: no rm process at all on the common path
  n=$#
  while [ "$n" -gt 0 ]; do
    if [ -e "$1" ] || [ -L "$1" ]; then set -- "$@" "$1"; fi
    shift; n=$((n - 1))
  done
  [ $# -eq 0 ] || rm -f -- "$@"
}}
cleanup() {{
  rmx ${{TMP:+"$TMP"}} ${{BTMP:+"$BTMP"}} ${{UP:+"$UP"}}
  [ -n "$LOCKDIR" ] && rmdir "$LOCKDIR"
  [ -n "$LT" ] && rm -rf "$LT"
}}
trap cleanup EXIT
fail() {{ code=$1; shift; printf '@@err %s\\n' "$*"; exit "$code"; }}
hash_of() {{ HASH=$(sha256sum < "$1") || return 1; HASH=${{HASH%% *}}; }}  # into $HASH: one subshell, not two
{WHOLE_LIB}
ME=${{PROBED_ME:-$(id -u)}}"""


def prepare(*, real_dir: str, live_real: str, want: str, upload_real: str | None, source_real: str | None,
            upload_dir: str | None, after_probe: bool = False) -> str:
    """The script's parameters; `after_probe`: it runs in the probe's shell (PROBED_ME is the probe's)."""
    q = shlex.quote
    first = "" if after_probe else 'PROBED_ME=""\n'
    return first + f"""D={q(real_dir)}; S="$D/{STATE}"; LIVE={q(live_real)}; WANT={q(want)}
UP={q(upload_real or '')}; SRC={q(source_real or '')}; UPDIR={q(upload_dir or '')}
NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ); NOWJ="\\"$NOW\\""
TMP="$D/.${{LIVE##*/}}.vgpu-patch-tmp.$$"; BTMP=""; NEWBK=""; LOCKDIR=""; LT=""
{RUNTIME}
umask 022"""


# The state dir is trusted only when nobody but its owner (root, when we are root) can change it and it
# holds no symlinks: then nothing can redirect a write (lock, history, backups) after this check.
SAFE_STATE = f"""[ -d "$D" ] || fail {WRITE} "$D is not a directory"
if [ -L "$S" ] || {{ [ -e "$S" ] && [ ! -d "$S" ]; }}; then
  fail {UNSAFE} "$S is a symlink or not a directory: refusing to write through it; remove it (nothing changed)"
fi
bad=""
# a state dir this run creates itself (mkdir fails on an existing one) holds nothing to check
if [ -e "$S" ] || ! mkdir "$S" "$S/backups" 2>/dev/null; then
  [ -d "$S/backups" ] || mkdir -p "$S/backups" || fail {WRITE} "cannot create $S"
  if [ "$ME" = 0 ]; then
    bad=$(find "$S" \\( -type l -o ! -user 0 -o -perm -002 -o \\( -type d -perm -020 \\) \\) -print 2>/dev/null)
  else
    bad=$(find "$S" -type l -print 2>/dev/null)
  fi
  bad=${{bad%%"$NL"*}}  # the first one found
fi
if [ -n "$bad" ]; then
  [ -L "$bad" ] && fail {UNSAFE} "$bad is a symlink inside $S: refusing to follow it; remove it (nothing changed)"
  m="$bad is not root's alone (owner $(stat -c %U "$bad"), mode $(stat -c %a "$bad")): refusing to use it as root;"
  fail {UNSAFE} "$m chown -R root:root $S and chmod go-w, or remove it (nothing changed)"
fi"""

LOCK = f"""if command -v flock >/dev/null 2>&1; then
  exec 9>>"$S/lock" || fail {WRITE} "cannot open $S/lock"
  flock -n 9 || fail {LOCKED} "locked"
else
  mkdir "$S/lock.d" 2>/dev/null || fail {LOCKED} "locked"; LOCKDIR="$S/lock.d"
fi
# temp files of a swap that was SIGKILLed: only a lock holder makes them, so any found now are orphans
rmx "$D"/.*.vgpu-patch-tmp.* "$S"/staging/*.part.* "$S"/backups/.*.tmp.*"""

STAGE = f"""# the file to go live, copied as root beside the live one under the lock: what is verified below
# is what the rename puts in place (an upload stays its login user's to change until it is copied)
[ -n "$SRC" ] || SRC=$UP
cp "$SRC" "$TMP" 2>&1 || fail {WRITE} "copying $SRC to $TMP failed (disk full?)"
if [ -n "$UP" ]; then rm -f "$UP"; UP=""; fi"""

# -- one session: the probe, then the script and its payload on the same stdin ----------------------
# The probe ends with AWAIT: it prints PROBE_END and waits for `@@go N` and an N-byte script, which it runs
# only when it arrived whole (it ends with SCRIPT_END); EOF instead (nothing to do) ends it quietly.
PROBE_END = "@@vgpu end"
SCRIPT_END = "# @@vgpu script end"
RECEIVED = "@@vgpu received"
AWAIT = f"""printf '\\n%s\\n' '{PROBE_END}'
while IFS= read -r l; do
  case $l in "@@go "*)
    n=${{l#@@go }}; s=$(head -c "$n")
    case $s in *"{SCRIPT_END}") eval "$s"; exit;; esac
    printf '@@err the swap script arrived cut; nothing changed\\n'; exit {WRITE};;
  esac
done
exit 0
"""


def receive(size: int) -> str:
    """The candidate's bytes, which follow the script on stdin, straight into the temp file beside the
    live one (as root, under the lock, created new and 0600: never a planted file). No upload in /tmp."""
    return f"""umask 077; set -C  # noclobber: the redirection creates $TMP with O_EXCL
head -c {int(size)} > "$TMP" || fail {WRITE} "receiving the upload into $TMP failed (it exists, or disk full?)"
set +C; umask 022; SRC="the upload\""""


# a test seam: the controller runs its after-upload hook on the file named, then sends a line
PAUSE = f"""printf '%s\\n%s\\n' "$TMP" '{RECEIVED}'; read -r _ || true"""


# The live file is copied aside first and that copy hashed with the candidate in one sha256sum: the
# backup, the history's from_sha256 and the no-op check all describe the bytes that were really there.
VERIFY_SOURCE = f"""cur=""
if [ -e "$LIVE" ]; then
  BTMP="$S/backups/.live.tmp.$$"
  cp "$LIVE" "$BTMP" 2>&1 || fail {WRITE} "backing up $LIVE failed (disk full?)"
  sums=$(sha256sum -- "$TMP" "$BTMP") || fail {WRITE} "sha256sum of $TMP failed"
  cur=${{sums#*"$NL"}}; cur=${{cur%%[ ]*}}; cur=${{cur#\\\\}}
else
  sums=$(sha256sum -- "$TMP") || fail {WRITE} "sha256sum of $TMP failed"
fi
got=${{sums%%[ ]*}}; got=${{got#\\\\}}  # a name sha256sum had to escape starts its line with a backslash
[ "$got" = "$WANT" ] || fail {MISMATCH} "sha256 of $SRC is $got, expected $WANT"
if [ "$cur" = "$WANT" ]; then echo "@@noop"; exit 0; fi"""

# LD_PRELOAD splits on spaces and colons: load the file through a link whose path has neither
LOADS = f"""PRE="$TMP"
case "$TMP" in *[[:space:]:]*)
  LT=$(mktemp -d /tmp/.vgpu-patch-load.XXXXXX) || fail {WRITE} "cannot create a temp dir in /tmp"
  ln -s "$TMP" "$LT/libvgpu.so" && PRE="$LT/libvgpu.so";;
esac
out=$(LD_PRELOAD="$PRE" /bin/true 2>&1); rc=$?
[ -n "$LT" ] && rm -rf "$LT"
case "$out" in *"cannot be preloaded"*|*"ERROR: ld.so"*) rc=127;; esac
[ "$rc" -eq 0 ] \\
  || fail {NOLOAD} "LD_PRELOAD of the new file made /bin/true fail (exit $rc): $(printf '%s' "$out" | head -n 1)\""""


def backup(manifest_printf: str) -> str:
    """Back up what is live now (it may differ from the plan: HAMi's plugin rewrites the file in place,
    outside any lock). The copy is hashed, so the backup's name and the history say what was replaced.
    A live file that is not a whole library (empty, or caught mid-copy) is replaced but never kept as a
    backup nor recorded as from_sha256 (REC): a rollback must never restore it."""
    return f"""BK=""; FROMJ=null; REC=""
if [ -n "$BTMP" ]; then
  SIZE=$(stat -c %s "$BTMP"); CURJ="\\"$cur\\""; FROMJ="$CURJ"; REC="$cur"
  BK="$S/backups/$cur.so"
  if ! whole_lib "$BTMP" "$SIZE"; then
    BK=""; FROMJ=null; REC=""
    printf '@@partial %s\\n' "$SIZE"
  elif [ -f "$BK" ] && [ -f "$S/backups/$cur.json" ] && hash_of "$BK" && [ "$HASH" = "$cur" ]; then
    :  # already kept; the copy is removed on exit
  else
    # the manifest first: one short write, and a manifest without its file reads as "not present" (a
    # file without one would be invisible); the next swap of this file rewrites both
    {manifest_printf} > "$S/backups/$cur.json" || fail {WRITE} "writing the backup manifest failed (disk full?)"
    mv -f "$BTMP" "$BK" || fail {WRITE} "storing the backup failed"
    NEWBK=1  # made durable with the new file, before the rename
  fi
fi"""


SWAP = f"""if [ -n "$cur" ]; then
  keep=mode; [ "$ME" = 0 ] && keep=mode,ownership
  # the live file's mode (and owner, as root) in one process; without GNU cp's --attributes-only, two
  if ! cp --attributes-only --preserve="$keep" "$LIVE" "$TMP" 2>/dev/null; then
    chmod --reference="$LIVE" "$TMP" 2>/dev/null || chmod 0644 "$TMP"
    [ "$ME" = 0 ] && chown --reference="$LIVE" "$TMP" 2>/dev/null
  fi
  if [ -e /sys/fs/selinux/enforce ] && command -v chcon >/dev/null 2>&1; then
    chcon --reference="$LIVE" "$TMP" 2>/dev/null
  fi
else
  chmod 0644 "$TMP"
fi
# the new file's bytes and a new backup's (bytes, manifest, name), before the rename
sync "$TMP" ${{NEWBK:+"$BK"}} ${{NEWBK:+"$S/backups/$cur.json"}} "$S/backups" 2>/dev/null || sync
out=$(mv -f "$TMP" "$LIVE" 2>&1) \\
  || fail {WRITE} "renaming $TMP over $LIVE failed ($out; EBUSY: $LIVE is a mount point, act on the host file)\""""

REVERIFY = f"""hash_of "$LIVE"; got=$HASH
[ "$got" = "$WANT" ] || fail {VERIFY} "after the swap $LIVE has sha256 $got, expected $WANT\""""

BYTE_COMPARE = (f"""if command -v cmp >/dev/null 2>&1; then cmp -s "$SRC" "$LIVE" """
                f"""|| fail {VERIFY} "$LIVE differs from $SRC byte for byte"; fi""")


def record(history_printf: str) -> str:
    return f"""{history_printf} >> "$S/history.jsonl" \\
  || fail {WRITE} "the swap is done but appending to $S/history.jsonl failed (disk full?)"
sync "$D" "$S/history.jsonl" 2>/dev/null || sync  # the rename (directory) and the record
# uploads orphaned by a dropped connection that could not be cleaned up then: older than an hour
for f in ${{UPDIR:+"$UPDIR"/.vgpu-patch-upload-*}}; do
  [ -e "$f" ] && command -v find >/dev/null 2>&1 \\
    && find "$UPDIR" -maxdepth 1 -name '.vgpu-patch-upload-*' -mmin +60 -exec rm -f {{}} + 2>/dev/null
  break
done
true"""


def _result(stale: bool) -> str:
    """The result line, then (`stale`) the live inode and every process mapping the library (one grep over
    all /proc maps)."""
    if not stale:
        return """printf '@@ok\\t%s\\t%s\\t-\\n' "${REC:--}" "${BK:--}\""""
    head = """printf '@@ok\\t%s\\t%s\\t%s\\n' "${REC:--}" "${BK:--}" "$(stat -c %i "$LIVE")"\n"""
    return head + f"printf '\\n@@vgpu maps\\n'\n{maps_snippet()}"


def report(stale: bool) -> str:
    return _result(stale) + "\nexit 0"


def script(fragments: list[str]) -> str:
    """The one script sent to the node: the plan's fragments, in order."""
    return "\n".join(f for f in fragments if f) + "\n"


# -- the rollback stack (also embedded, as source, in the Ansible role's script: one rule) --------------
def rollback_stack(history):  # type: (list[dict]) -> list[str]
    """The files a rollback can walk back through, oldest first: each swap pushes what it replaced, each
    rollback to a file on the stack pops back to below it (deploy v1, v2; rollback, rollback = v1, vendor)."""
    stack = []  # type: list[str]
    for e in history:
        frm, to = e.get("from_sha256"), e.get("to_sha256")
        if not isinstance(to, str):
            continue
        if e.get("action") == "rollback" and to in stack:
            del stack[len(stack) - 1 - stack[::-1].index(to):]
            continue
        if isinstance(frm, str) and frm != to and (not stack or stack[-1] != frm):
            stack.append(frm)
    return stack


_PICK_MAIN = """
import json, os, sys
path, live, to = sys.argv[1:4]
history = []
try:
    with open(path, "rb") as f:
        for raw in f:
            try:
                doc = json.loads(raw.decode("utf-8"))
            except ValueError:
                continue  # a torn or undecodable line: skipped, as by the CLI
            if isinstance(doc, dict):
                history.append(doc)
except IOError:
    pass
def whole(h):  # a backup that is not a whole library (kept by older versions) is never restored
    try:
        return os.path.getsize(os.path.join(os.path.dirname(path), "backups", h + ".so")) > 64
    except OSError:
        return True  # missing: the swap script's own check says so
stack = [h for h in rollback_stack(history) if h != live and whole(h)]
print((stack[0] if to == "vendor" else stack[-1]) if stack else "")
"""


def _pick_program() -> str:
    import inspect

    return inspect.getsource(rollback_stack) + _PICK_MAIN


# -- the standalone script the Ansible role runs: the same fragments, parameters from variables --------
AMBIGUOUS = 67

STANDALONE_PROLOGUE = f"""# Parameters (set before this text): VGPU_DIR VGPU_ACTION (deploy|rollback) VGPU_WANT
# VGPU_UP (a path, or -: base64 on stdin) VGPU_TO
# VGPU_INSTALL (1: install where no library is) VGPU_OPERATOR_JSON VGPU_TOOL_JSON
# VGPU_STALE (1: list the processes still mapping the library)
D=$VGPU_DIR; S="$D/{STATE}"; WANT=$VGPU_WANT; UP=$VGPU_UP; SRC=""; UPDIR=${{UP%/*}}; PROBED_ME=""
NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ); NOWJ="\\"$NOW\\""; OPJ=$VGPU_OPERATOR_JSON; TOOLJ=$VGPU_TOOL_JSON
ACTJ="\\"$VGPU_ACTION\\""; BTMP=""; NEWBK=""; LOCKDIR=""; LT=""; TMP=""
{RUNTIME}
if [ "$UP" = - ]; then  # the candidate comes base64-encoded on stdin: saved 0600 (mktemp), removed by cleanup
  UP=$(mktemp "${{TMPDIR:-/tmp}}/.vgpu-patch-upload-XXXXXXXXXX") || fail {WRITE} "cannot create an upload file in /tmp"
  UPDIR=${{UP%/*}}
  base64 -d > "$UP" || fail {WRITE} "receiving the candidate on stdin failed (disk full?)"
fi
umask 022"""

# docs/node-state.md "The live file": node.sh's choose_live decides (the CLI's probe runs the same function)
CHOOSE_LIVE = f"""[ -d "$D" ] || fail {WRITE} "$D is not a directory: is HAMi installed? set vgpu_patch_target_dir"
choose_live || fail {AMBIGUOUS} "$WHY"
[ -L "$LIVE" ] \\
  && fail {AMBIGUOUS} "$LIVE is a symlink to $(readlink "$LIVE"); replace the file it points at, or make it a file"
[ -e "$LIVE" ] || [ "$VGPU_INSTALL" = 1 ] || fail {WRITE} "no {LIB} in $D to replace; check vgpu_patch_target_dir"
TMP="$D/.${{LIVE##*/}}.vgpu-patch-tmp.$$"
LIVEJ=$(printf '%s' "$LIVE" | sed 's/\\\\/\\\\\\\\/g; s/"/\\\\"/g'); LIVEJ="\\"$LIVEJ\\"\""""


def _report_if_asked() -> str:
    """The role's report: the stale scan only with VGPU_STALE=1 (vgpu_patch_report_mappers), like --stale-pids."""
    return f"""if [ "${{VGPU_STALE:-0}}" = 1 ]; then
{textwrap.indent(_result(stale=True), "  ")}
else
{textwrap.indent(_result(stale=False), "  ")}
fi
exit 0"""


def _pick_fragment() -> str:
    return f"""cur=""; [ -e "$LIVE" ] && hash_of "$LIVE" && cur=$HASH
case "$VGPU_TO" in
  ""|previous|vendor)
    command -v python3 >/dev/null 2>&1 || fail {WRITE} "python3 is needed on the node to read the rollback stack"
    WANT=$(python3 -c {shlex.quote(_pick_program())} "$S/history.jsonl" "$cur" "${{VGPU_TO:-previous}}")
    m="no earlier file to roll back to on this node (every recorded swap is rolled back, or none was recorded);"
    [ -n "$WANT" ] || fail {WRITE} "$m pass vgpu_patch_rollback_to=SHA256";;
  *)
    set -- "$S"/backups/"$VGPU_TO"*.so
    [ "$#" -eq 1 ] && [ -f "$1" ] || fail {WRITE} "no single backup matches $VGPU_TO in $S/backups; see status.yml"
    [ "$(stat -c %s "$1")" -gt 64 ] || fail {WRITE} "$1 is not a whole library: it is never restored; pick another"
    WANT=${{1##*/}}; WANT=${{WANT%.so}};;
esac
SRC="$S/backups/$WANT.so\""""


def standalone(action: str) -> str:
    """The Ansible role's script for `deploy` or `rollback`: the CLI's fragments, one lock, one task."""
    hist = _printf_json({"time": _NOW, "action": _Shell("ACTJ"), "path": _Shell("LIVEJ"), "from_sha256": _FROM,
                         "to_sha256": _Shell("WANTJ"), "operator": _Shell("OPJ"), "tool": _Shell("TOOLJ")})
    man = _printf_json({"sha256": _CUR, "size": _SIZE, "path": _Shell("LIVEJ"), "saved_at": _NOW,
                        "operator": _Shell("OPJ"), "tool": _Shell("TOOLJ")})
    parts = [STANDALONE_PROLOGUE, node_program(), CHOOSE_LIVE, SAFE_STATE, LOCK]
    if action == "rollback":
        parts.append(_pick_fragment())
    parts += [STAGE, 'WANTJ="\\"$WANT\\""', VERIFY_SOURCE, LOADS, backup(man), SWAP, REVERIFY]
    if action == "rollback":
        parts.append(BYTE_COMPARE)
    parts += [record(hist), _report_if_asked()]
    head = f"#!/bin/sh\n# Generated by `python3 -m vgpu_patch.deploy.script` ({action}): do not edit.\n"
    return head + script(parts)


if __name__ == "__main__":  # regenerate the Ansible role's copies
    import sys
    from pathlib import Path

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("ansible/roles/vgpu_patch/files")
    for act in ("deploy", "rollback"):
        (out / f"vgpu-patch-{act}.sh").write_text(standalone(act))
