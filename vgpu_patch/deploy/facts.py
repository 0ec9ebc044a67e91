"""Read-only facts about a node, gathered in one privileged round trip (a probe script plus parsers).

Nothing here changes the node. `gather()` returns NodeFacts; `choose_live()` applies the rule of
docs/node-state.md (the single versioned `libvgpu.so.<v>`, else `libvgpu.so`; refuse ambiguity).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from ..errors import DeployError
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

    def file(self, name: str) -> LibFile | None:
        return next((f for f in self.files if f.name == name), None)

    def backup(self, sha256: str) -> dict | None:
        return next((b for b in self.backups if b.get("sha256") == sha256 and b.get("present")), None)

    def stale_pids(self, live: LibFile | None) -> list[int]:
        """Processes mapping a deleted or older inode of the library: they need a restart."""
        ino = live.inode if live else -1
        return sorted({m.pid for m in self.mapped if m.deleted or m.inode != ino})


# -- the probe ------------------------------------------------------------------------------------
def _section(name: str) -> str:
    return f"printf '\\n@@vgpu %s\\n' {name}"


def probe_script(real_dir: str, *, history: int = 20, maps: bool = True) -> str:
    d = shlex.quote(real_dir.rstrip("/") or "/")
    parts = [
        f"D={d}; S=\"$D/{STATE}\"",
        _section("arch"), "uname -m",
        _section("glibc"), "getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1",
        _section("uid"), "PROBED_ME=$(id -u); echo \"$PROBED_ME\"",  # reused by a swap in the same shell
        _section("flock"), "command -v flock || true",
        _section("dir"), "[ -d \"$D\" ] && echo yes",
        _section("df"),
        "p=\"$D\"; while [ ! -d \"$p\" ]; do p=$(dirname \"$p\"); done; df -Pk \"$p\"",  # its last line counts
        _section("files"),
        "TAB=$(printf '\\t'); NL='\n'",
        "for f in \"$D\"/" + LIB + " \"$D\"/" + LIB + ".*; do"
        " n=${f##*/};"
        # a tab or newline in a name would forge columns or lines: say which name, no more (parse_files warns)
        " case $n in *\"$TAB\"*|*\"$NL\"*)"
        " printf 'X\\t%s\\n' \"$(printf %s \"$n\" | tr '\\t\\n' '  ')\"; continue;; esac;"
        " if [ -L \"$f\" ]; then printf 'L\\t%s\\t%s\\n' \"$n\" \"$(readlink \"$f\")\"; continue; fi;"
        " [ -f \"$f\" ] || continue;"
        " h=$(sha256sum < \"$f\"); h=${h%% *};"
        " v=$(grep -a -o -m 1 'vgpu-patch-shim [0-9A-Za-z.+~_-]*' \"$f\");"
        " printf 'F\\t%s\\t%s\\t%s\\t%s\\n' \"$n\" \"$h\" \"$(stat -c '%s %i %a %u %g' \"$f\")\" \"$v\";"
        " done",
        # never read through a symlink (as root it could point anywhere): a linked ld.so.preload is not read
        _section("preload"),
        "[ -f \"$D/ld.so.preload\" ] && [ ! -L \"$D/ld.so.preload\" ] && { echo present; cat \"$D/ld.so.preload\"; }",
        _section("state"), STATE_CHECK,
        _section("backups"),
        "[ -n \"$UNSAFE\" ] || for j in \"$S\"/backups/*.json; do [ -f \"$j\" ] || continue; h=${j##*/}; h=${h%.json};"
        " if [ -f \"$S/backups/$h.so\" ]; then printf 'yes\\t'; else printf 'no\\t'; fi;"
        " tr -d '\\n' < \"$j\"; echo; done",
        _section("history"),
        f"[ -z \"$UNSAFE\" ] && [ -f \"$S/history.jsonl\" ] && tail -n {int(history)} \"$S/history.jsonl\"",
    ]
    if maps:
        parts += [_section("maps"), maps_snippet()]
    parts.append("true")
    return "\n".join(parts) + "\n"


# Read-only twin of script.SAFE_STATE: as root, never read through a state dir someone else controls.
STATE_CHECK = (
    'UNSAFE=""; if [ -L "$S" ]; then UNSAFE=1; echo "$S is a symlink";'
    ' elif [ -d "$S" ]; then'
    ' if [ "$(id -u)" = 0 ]; then'
    ' bad=$(find "$S" \\( -type l -o ! -user 0 -o -perm -002 -o \\( -type d -perm -020 \\) \\) -print 2>/dev/null'
    ' | head -n 1);'
    ' else bad=$(find "$S" -type l -print 2>/dev/null | head -n 1); fi;'
    ' if [ -L "$bad" ]; then UNSAFE=1; echo "$bad is a symlink inside $S";'
    ' elif [ -n "$bad" ]; then UNSAFE=1;'
    ' echo "$bad is not root\'s alone (owner $(stat -c %U "$bad"), mode $(stat -c %a "$bad"))";'
    ' fi; fi'
)


def maps_snippet() -> str:
    """One grep over every process's maps for the library dir (and HAMi's in-container path)."""
    return (
        "grep -s -H -F -e \"$D/" + LIB + "\" -e " + shlex.quote(CONTAINER_LIB) + " /proc/[0-9]*/maps | sort -u || true"
    )


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
    state = sec.get("state") or []
    if state:
        facts.state_problem = (f"{state[0]}: refusing to read or write node state through it; remove the "
                               f"symlink, or chown -R root:root and chmod go-w the state dir (nothing changed)")
    facts.mapped = parse_maps(sec.get("maps", []))
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


# -- the rule for the live file ---------------------------------------------------------------------
def choose_live(facts: NodeFacts, node: str) -> LibFile | None:
    """The file HAMi really uses, None when the directory holds none; DeployError when that is ambiguous."""
    where = f"{node}:{facts.target_dir}"
    versioned = [f for f in facts.files if f.name.startswith(LIB + ".")]
    if len(versioned) > 1:  # an upgraded plugin's new file beside the old: follow ld.so.preload if it names one
        named = {w.rsplit("/", 1)[-1] for line in facts.preload or [] if not line.strip().startswith("#")
                 for w in line.replace(":", " ").split()}
        versioned = [f for f in versioned if f.name in named] or versioned
    if len(versioned) > 1:
        names = ", ".join(f.name for f in versioned)
        raise DeployError(
            f"{where}: several versioned libraries ({names}) and ld.so.preload names none of them; HAMi's choice is "
            "unclear: remove the stale ones, then rerun"
        )
    live = versioned[0] if versioned else facts.file(LIB)
    if live is not None and live.link_to is not None:
        raise DeployError(
            f"{where}: {live.name} is a symlink to {live.link_to}; replace the file it points at "
            f"(its directory as --target-dir) or make {live.name} a regular file"
        )
    if facts.preload is not None:
        allowed = {LIB} | ({live.name} if live else set())
        for line in facts.preload:
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            for word in entry.replace(":", " ").split():
                base = word.rsplit("/", 1)[-1]
                if base.startswith("libvgpu") and base not in allowed:
                    raise DeployError(
                        f"{where}: ld.so.preload names {word} but the live file is "
                        f"{live.name if live else 'missing'}; fix ld.so.preload (or the plugin), then rerun"
                    )
    return live
