"""Read-only facts about a node, gathered in one privileged round trip (a probe script plus parsers).

Nothing here changes the node. `gather()` returns NodeFacts. Which file is live (docs/node-state.md) is
decided on the node, by `choose_live` in the node program (data/node.sh) that every tool sends; the probe
prints its verdict and `choose_live()` here only reads it.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from ..report.errors import DeployError
from ..transport.base import Transport
from .candidate import parse_glibc

LIB = "libvgpu.so"
STATE = ".vgpu-patch"
ALL_HISTORY = 100000  # history lines read for a rollback (the stack needs them all; one line per swap)
# In containers HAMi mounts the chosen host file here, whatever its host name.
CONTAINER_LIB = "/usr/local/vgpu/libvgpu.so"


@dataclass
class LibFile:
    name: str
    path: str  # node path
    sha256: str = ""
    size: int = 0
    inode: int = 0
    mode: str = "644"
    uid: int = 0
    gid: int = 0
    link_to: str | None = None  # set for symlinks (no other field then)
    ours_version: str | None = None


@dataclass
class MappedLib:
    pid: int
    inode: int
    path: str
    deleted: bool


@dataclass
class NodeFacts:
    target_dir: str
    arch: str = ""
    glibc: tuple[int, int] | None = None
    uid: int = -1
    has_flock: bool = False
    dir_exists: bool = False
    free_bytes: int | None = None
    files: list[LibFile] = field(default_factory=list)
    preload: list[str] | None = None  # lines of <dir>/ld.so.preload, None when absent
    backups: list[dict] = field(default_factory=list)  # manifests, each with "present": bool
    history: list[dict] = field(default_factory=list)
    mapped: list[MappedLib] = field(default_factory=list)
    state_problem: str | None = None  # the state dir is unsafe to use (symlinks, not root's): refuse it
    warnings: list[str] = field(default_factory=list)
    live_name: str | None = None  # the node program's choice (a name in target_dir), None when it refused
    live_why: str = ""  # the evidence that decided it, or why it refused
    plugin_manifest: dict | None = None  # vgpu-patch-manifest.json a plugin image (plugin-image) installed
    signatures: dict[str, dict] = field(default_factory=dict)  # sha256 -> its kept signature's record (present)
    rollback_to: str | None = None  # the node program's rollback target (choose_backup), None when it refused
    rollback_why: str = ""  # why that one, or why it refused ("" when the probe was not asked: TO unset)

    def file(self, name: str) -> LibFile | None:
        return next((f for f in self.files if f.name == name), None)

    def backup(self, sha256: str) -> dict | None:
        return next((b for b in self.backups if b.get("sha256") == sha256 and b.get("present")), None)

    def signer(self, sha256: str) -> dict | None:
        """Who signed the file of this sha256 ({"principal", "key"}), as verified when it went live; None when
        no signature of it is kept (the vendor's file, an unsigned deploy)."""
        rec = self.signatures.get(sha256)
        signer = rec.get("signer") if rec else None
        return signer if isinstance(signer, dict) else None

    def stale_pids(self, live: LibFile | None) -> list[int]:
        """Processes mapping a deleted or older inode of the library: they need a restart."""
        ino = live.inode if live else -1
        return sorted({m.pid for m in self.mapped if m.deleted or m.inode != ino})


# -- the probe ------------------------------------------------------------------------------------
@cache
def node_program() -> str:
    """data/node.sh: the functions every tool runs on a node (the CLI, the agent and the Ansible role)."""
    return (resources.files("vgpu_patch") / "data" / "node.sh").read_text()


def probe_script(real_dir: str, *, history: int = 20, maps: bool = True, proc: str = "/proc",
                 rollback_to: str | None = None) -> str:
    """node.sh's `probe` with its parameters (`proc`: where the node's processes are; a test points it elsewhere).
    It prints one `@@vgpu <name>` section per fact, the live file's verdict among them (section `live`), and
    with `rollback_to` (previous, vendor or a sha256 prefix) the rollback's target (section `rollback`)."""
    d = real_dir.rstrip("/") or "/"
    args = {"D": d, "PROC": proc, "HISTORY": int(history), "MAPS": 1 if maps else 0, "TO": rollback_to or ""}
    return node_program() + "\n" + "; ".join(f"{k}={shlex.quote(str(v))}" for k, v in args.items()) + "\nprobe\n"


def _split_sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@vgpu "):
            cur = out.setdefault(line[7:].strip(), [])
        elif cur is not None and line.strip():
            cur.append(line.rstrip("\r"))
    return out


def _plain(name: str) -> bool:
    """A name HAMi could load: no tab, newline or other control character (ld.so.preload splits on them)."""
    return name.isprintable()


def parse_files(lines: list[str], node_dir: str, warnings: list[str] | None = None) -> list[LibFile]:
    """The probe's `files` lines. A name with a tab, newline or other control character is no library HAMi
    loads (ld.so.preload splits on whitespace) and would shift columns: it is skipped with a warning."""
    files = []
    for line in lines:
        kind, _, rest = line.partition("\t")
        if kind not in ("L", "F", "X"):
            continue
        f = _lib_file(kind, rest, node_dir)
        if f is not None:
            files.append(f)
        elif warnings is not None:
            warnings.append(f"ignored {rest.split(chr(9), 1)[0]!r} in {node_dir}: not a plain file name (a tab, "
                            "newline or control character); rename or remove it")
    return files


def _lib_file(kind: str, rest: str, node_dir: str) -> LibFile | None:
    """One `files` line; None for the probe's X (a name with a tab or newline) or a line that does not parse."""
    try:
        if kind == "L":
            name, target = rest.split("\t")
            return LibFile(name, f"{node_dir}/{name}", link_to=target) if _plain(name) else None
        if kind == "F":
            name, sha, stat, ver = rest.rsplit("\t", 3)  # only the name is free text: split from the right
            size, inode, mode, uid, gid = stat.split()
            if _plain(name) and len(sha) == 64:
                return LibFile(name, f"{node_dir}/{name}", sha, int(size), int(inode), mode, int(uid), int(gid),
                               None, ver.split(" ", 1)[1] if " " in ver else None)
    except ValueError:
        pass
    return None


def parse_maps(lines: list[str]) -> list[MappedLib]:
    out = []
    for line in lines:
        head, _, rest = line.partition(":")
        if not head.startswith("/proc/"):
            continue
        cols = rest.split(None, 5)
        if len(cols) < 6:
            continue
        path = cols[5]
        deleted = path.endswith(" (deleted)")
        out.append(MappedLib(int(head.split("/")[2]), int(cols[4]), path.replace(" (deleted)", ""), deleted))
    return out


def _json_lines(lines: list[str], warnings: list[str] | None = None, what: str = "history.jsonl") -> list[dict]:
    out = []
    for line in lines:
        if "\ufffd" in line:  # bytes that are not UTF-8: skip the line, say so, carry on
            if warnings is not None:
                warnings.append(f"skipped a line of {what} that is not valid UTF-8: {line[:60]!r}")
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn or foreign line must not hide the rest of the history
        if isinstance(doc, dict):
            out.append(doc)
    return out


def parse(text: str, node_dir: str) -> NodeFacts:
    sec = _split_sections(text)

    def one(k: str) -> str:
        return (sec.get(k) or [""])[0].strip()

    facts = NodeFacts(target_dir=node_dir)
    facts.arch = one("arch")
    facts.glibc = parse_glibc(one("glibc"))
    facts.uid = int(one("uid") or -1)
    facts.has_flock = bool(one("flock"))
    facts.dir_exists = one("dir") == "yes"
    df = (sec.get("df") or [""])[-1].split()  # df's header, then the filesystem's line
    facts.free_bytes = int(df[3]) * 1024 if len(df) >= 4 and df[3].isdigit() else None
    facts.files = parse_files(sec.get("files", []), node_dir, facts.warnings)
    pre = sec.get("preload")
    facts.preload = pre[1:] if pre and pre[0] == "present" else None
    for line in sec.get("backups", []):
        present, _, doc = line.partition("\t")
        for b in _json_lines([doc], facts.warnings, "a backup manifest"):
            b["present"] = present == "yes"
            facts.backups.append(b)
    facts.backups.sort(key=lambda b: str(b.get("saved_at", "")))
    facts.history = _json_lines(sec.get("history", []), facts.warnings)
    for line in sec.get("signatures", []):
        present, _, doc = line.partition("\t")
        for rec in _json_lines([doc], facts.warnings, "a signature record"):
            if present == "yes" and isinstance(rec.get("sha256"), str):  # a record without its .sig: not kept
                facts.signatures[rec["sha256"]] = rec
    state = sec.get("state") or []
    if state:
        facts.state_problem = (f"{state[0]}: refusing to read or write node state through it; remove the "
                               f"symlink, or chown -R root:root and chmod go-w the state dir (nothing changed)")
    facts.mapped = parse_maps(sec.get("maps", []))
    pm = _json_lines(sec.get("plugin_manifest", []), facts.warnings, "vgpu-patch-manifest.json")
    facts.plugin_manifest = pm[0] if pm else None
    verdict = (sec.get("live") or [""])[0].split("\t")
    if verdict[0] == "ok" and len(verdict) >= 3:
        facts.live_name, facts.live_why = verdict[1], verdict[2]
    elif verdict[0] == "refuse" and len(verdict) >= 2:
        facts.live_why = verdict[1]
    pick = (sec.get("rollback") or [""])[0].split("\t")
    if pick[0] == "ok" and len(pick) >= 3 and len(pick[1]) == 64:
        facts.rollback_to, facts.rollback_why = pick[1], pick[2]
    elif pick[0] == "refuse" and len(pick) >= 2:
        facts.rollback_why = pick[1]
    # a swap killed between its rename and its record: on record when its file is live (node.sh `settle`)
    pending = _json_lines(sec.get("pending", []), facts.warnings, "pending.json")
    live = facts.file(facts.live_name) if facts.live_name else None
    facts.history = settle(facts.history, pending[0] if pending else None, live.sha256 if live else None)
    return facts


def gather(t: Transport, target_dir: str, *, history: int = 20, maps: bool = True) -> NodeFacts:
    """Run the probe as root (it reads every process's maps) and parse it."""
    node_dir = target_dir.rstrip("/") or "/"
    res = t.run(probe_script(t.path(node_dir), history=history, maps=maps), sudo=True, timeout=120)
    return from_probe(t, res.stdout, node_dir, maps=maps)


def from_probe(t: Transport, text: str, node_dir: str, *, maps: bool) -> NodeFacts:
    """NodeFacts from what the probe printed (run by `gather`, or at the head of a deploy's one session)."""
    facts = parse(text, node_dir)
    if not facts.arch:
        raise DeployError(f"{t.name}: the node probe printed nothing usable; is /bin/sh a POSIX shell?")
    if maps:  # map the fake root back: maps show real paths
        real = t.path(node_dir)
        for m in facts.mapped:
            if m.path.startswith(real + "/"):
                m.path = node_dir + m.path[len(real):]
    return facts


def settle(history: list[dict], pending: dict | None, live: str | None) -> list[dict]:
    """The history with a swap killed between its rename and its record put back (node.sh `settle`): each swap
    writes its line to pending.json before the rename and moves it into history.jsonl after. A pending line that
    is not the last history line (a kill before the move) counts as done when its file is live (`live`: its
    sha256 now)."""
    if pending is None or pending.get("to_sha256") != live or live is None or history[-1:] == [pending]:
        return history
    return [*history, pending]


# -- the live file: the node program's verdict --------------------------------------------------------
def choose_live(facts: NodeFacts, node: str) -> LibFile | None:
    """The file HAMi really uses (as the probe chose it), None when the directory holds none; DeployError when
    the probe refused (ambiguous) or the live file is a symlink."""
    where = f"{node}:{facts.target_dir}"
    if facts.live_name is None:
        raise DeployError(f"{where}: {facts.live_why or 'the probe printed no live-file verdict; is /bin/sh POSIX?'}")
    live = facts.file(facts.live_name)
    if live is not None and live.link_to is not None:
        raise DeployError(
            f"{where}: {live.name} is a symlink to {live.link_to}; replace the file it points at "
            f"(its directory as --target-dir) or make {live.name} a regular file"
        )
    return live


def chosen_backup(facts: NodeFacts, node: str) -> dict:
    """The backup a rollback restores, as the probe's node program chose it (node.sh `choose_backup`, the one
    rollback rule of the CLI, the agent and the Ansible role); DeployError with its reason when it refused."""
    where = f"{node}:{facts.target_dir}"
    if facts.rollback_to is None:
        why = facts.rollback_why or "the probe printed no rollback verdict; is /bin/sh POSIX?"
        raise DeployError(f"{where}: {why}; nothing was changed")
    backup = facts.backup(facts.rollback_to)
    if backup is None:  # the probe checked it is kept: only a change since then
        raise DeployError(f"{where}: the backup of {facts.rollback_to[:12]} is no longer in {facts.target_dir}/"
                          f"{STATE}/backups; see `vgpu-patch status`, nothing was changed")
    return backup


def other_files(facts: NodeFacts) -> list[str]:
    """Every libvgpu.so* in the directory but the live one: leftovers and older versions, never live."""
    return [f.name for f in facts.files if f.name != facts.live_name]


COPY_BACK = "replaced outside vgpu-patch (the device plugin's copy-back?)"
FIX_BY_AGENT = "run the node agent (vgpu-patch daemonset) to put our library back after every copy-back"
FIX_BY_IMAGE = "ship our library in the device-plugin image as libvgpu.so.<VERSION> to stop copy-back for good"
COPY_BACK_HINT = f"{FIX_BY_AGENT}, or {FIX_BY_IMAGE}"


def last_change(history: list[dict]) -> dict | None:
    """The newest history record that says what it set (a record without a to_sha256 is skipped)."""
    return next((e for e in reversed(history) if isinstance(e.get("to_sha256"), str)), None)


def delivered_by_plugin(facts: NodeFacts, live: LibFile | None) -> bool:
    """Whether the device plugin itself installed the live file: its image carries our library and manifest
    (`vgpu-patch plugin-image`), and the live file is that library."""
    pm = facts.plugin_manifest
    return bool(live is not None and pm is not None and pm.get("sha256") == live.sha256)


def replaced_outside(history: list[dict], live: LibFile | None) -> dict | None:
    """The last recorded change when the live file no longer holds what it wrote: someone replaced the file
    outside every tool (HAMi's plugin copies its own library back on restart). None when it still holds it,
    when nothing was ever recorded, or when no regular file is live."""
    if live is None or live.link_to is not None:
        return None
    last = last_change(history)
    if last is None or last["to_sha256"] == live.sha256:
        return None
    return last
