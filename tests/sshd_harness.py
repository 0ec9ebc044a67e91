"""A real OpenSSH sshd on 127.0.0.1 for tests and benchmarks: throwaway keys, one tmp dir per server.

Shared by the deploy tests (tests/deploy), the Ansible tests and bench/deploy_*.py. The API below is
stable; add to it, never rename.

    from sshd_harness import SSHD, inventory_ini, known_hosts_file   # tests/ is on sys.path under pytest

    with SSHD(tmp_path / "n1") as node:              # logs in as the current user (root in CI)
        node.host, node.port, node.user             # "127.0.0.1", free port, login name
        node.key_path                               # client private key (ed25519, no passphrase)
        node.known_hosts                            # known_hosts file holding this server's key
        node.ssh_config_path                        # OpenSSH config: `Host <node.alias>` with everything set
        node.alias                                  # the Host name used in ssh_config and inventories
        node.ssh_command("id -u")                   # argv for the OpenSSH client (`ssh -F cfg alias cmd`)
        node.inventory_ini()                        # writes <dir>/inventory.ini (group "gpu"), returns its Path
        node.host_key_fingerprint                   # "SHA256:..." as ssh-keygen prints it
        node.rotate_host_key()                      # restart on the same port with a new host key
        node.kill_sessions()                        # SIGKILL every live connection (the listener stays)
        node.kill_sessions(children=False)          # only the sshd processes: the remote commands run on
        node.target                                 # "user@127.0.0.1:port" (the --host form)
        node.host_key_line                          # "[127.0.0.1]:port ssh-ed25519 AAAA..." (known_hosts form)
        node.inventory_vars()                       # "ansible_host=... ansible_port=... ansible_user=... ..."
        node.dir, node.log_path                     # its tmp dir; sshd's own log (-e, LogLevel VERBOSE)
        node.stop()                                 # also kills live sessions; start() brings it back

    SSHD(dir, user="vgpudeploy", create_user=True, sudo=True, requiretty=True)
        As root only: creates the unix user (`useradd -m`, account unlocked for key login), adds
        `/etc/sudoers.d/vgpu-patch-test-<user>` allowing `NOPASSWD` exactly /bin/sh and /usr/bin/sh
        (the tool runs every privileged step as `sudo -n sh -c SCRIPT`), optionally with `requiretty`.
        sudo=False removes any such rule (to test a refused sudo). The user's shell is /bin/sh.
        Raises `HarnessUnavailable` when not root;
        `require_root()` turns that into a pytest skip.
    SSHD(dir, user="u", create_user=True, sudo_password="pw")
        As above, but the user's password is set and its sudo rule asks for it every time (PASSWD,
        timestamp_timeout=0): for testing password sudo.
    SSHD(dir, client_key=other.key_path)            # reuse one client key across a fleet (fast, one agent)

Module helpers for fleets: `inventory_ini(servers, path, group="gpu")`, `inventory_yaml(servers, path, group)`,
`known_hosts_file(servers, path)`, `ssh_config_file(servers, path)`, `start_many(n, base_dir, **kw)`.

Needs /usr/sbin/sshd and ssh-keygen. Root is not required for a server logging in the current user.
authorized_keys lives in its own world-readable tmp dir (sshd reads it as the login user, and
pytest's tmp dirs are 0700). Users are left in place at exit (shared by later runs); the sudoers rules
this process wrote are removed.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SSHD_BIN = os.environ.get("VGPU_TEST_SSHD", "/usr/sbin/sshd")
SUDO_SHELLS = ("/bin/sh", "/usr/bin/sh")


class HarnessUnavailable(RuntimeError):
    """This machine cannot run the requested sshd setup (no sshd, not root for user creation...)."""


def available() -> str | None:
    """None when an sshd can be started here, else the reason why not."""
    if not os.access(SSHD_BIN, os.X_OK):
        return f"{SSHD_BIN} not found"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not found"
    return None


def require_root() -> None:
    """Skip the calling test unless running as root (creating users and sudo rules needs it)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (creates a unix user and a sudoers rule)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    path.chmod(0o600)


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        proc = subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], capture_output=True, text=True)
        # 9 = already exists (another test session created it meanwhile).
        if proc.returncode not in (0, 9):
            raise HarnessUnavailable(f"useradd {name} failed: {proc.stderr.strip()}") from None
    # useradd leaves the password "!" (locked); sshd without PAM refuses locked accounts. "*" = no password.
    subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)


# path -> what it held before this process first changed it (None: it did not exist). Exit cleanup
# puts back exactly that: a rule this process created is removed, one it found is left (or restored),
# so a rule written by the operator or by a parallel test run is never deleted by this one.
_ORIGINAL_SUDOERS: dict[Path, str | None] = {}


def _sudoers_path(user: str) -> Path:
    return Path(f"/etc/sudoers.d/vgpu-patch-test-{user}")


def _remember(path: Path) -> None:
    if path not in _ORIGINAL_SUDOERS:
        _ORIGINAL_SUDOERS[path] = path.read_text() if path.exists() else None


@atexit.register
def _restore_sudoers() -> None:
    """A root shell rule for a test user must not outlive the test run that created it."""
    for path, before in _ORIGINAL_SUDOERS.items():
        if before is None:
            path.unlink(missing_ok=True)
        elif not path.exists() or path.read_text() != before:
            _install_sudoers(path, before)


def _install_sudoers(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")  # sudo ignores names containing a dot
    tmp.write_text(text)
    tmp.chmod(0o440)
    check = subprocess.run(["visudo", "-cf", str(tmp)], capture_output=True, text=True)
    if check.returncode != 0:
        tmp.unlink()
        raise HarnessUnavailable(f"sudoers rule rejected: {check.stdout} {check.stderr}")
    os.replace(tmp, path)


def _write_sudoers(user: str, requiretty: bool, password: bool = False) -> Path:
    path = _sudoers_path(user)
    if password:  # sudo asks every time (no cached credentials), at most twice
        lines = [f"Defaults:{user} timestamp_timeout=0, passwd_tries=2",
                 f"{user} ALL=(root) PASSWD: {', '.join(SUDO_SHELLS)}"]
    else:
        lines = [f"{user} ALL=(root) NOPASSWD: {', '.join(SUDO_SHELLS)}"]
    if requiretty:
        lines.insert(0, f"Defaults:{user} requiretty")
    text = "\n".join(lines) + "\n"
    if path.exists() and path.read_text() == text:
        return path  # already there (another run's, or ours): not ours to remove
    _remember(path)
    _install_sudoers(path, text)
    return path


def _remove_sudoers(user: str) -> None:
    path = _sudoers_path(user)
    if path.exists():
        _remember(path)  # put back at exit: a refused-sudo test must not cost another run its rule
        path.unlink(missing_ok=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class SSHD:
    """One sshd listening on 127.0.0.1:<free port>. See the module docstring."""

    host = "127.0.0.1"

    def __init__(
        self,
        workdir: Path | str,
        *,
        user: str | None = None,
        create_user: bool = False,
        sudo: bool = True,
        requiretty: bool = False,
        client_key: Path | str | None = None,
        alias: str | None = None,
        start: bool = True,
        sudo_password: str | None = None,
    ) -> None:
        reason = available()
        if reason:
            raise HarnessUnavailable(reason)
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        # sshd reads authorized_keys with the login user's rights: keep the dir world-readable.
        self.dir.chmod(0o755)
        self.user = user or pwd.getpwuid(os.geteuid()).pw_name
        self.port = 0
        self.alias = alias or ""
        self.proc: subprocess.Popen | None = None
        self._sudoers_user: str | None = None
        if create_user or user not in (None, pwd.getpwuid(os.geteuid()).pw_name):
            if os.geteuid() != 0:
                raise HarnessUnavailable("creating a login user and its sudo rule needs root")
            if create_user:
                _ensure_user(self.user)
            if sudo_password is not None:
                subprocess.run(["chpasswd"], input=f"{self.user}:{sudo_password}\n", text=True, check=True,
                               capture_output=True)
            if sudo and self.user != "root":
                _write_sudoers(self.user, requiretty, password=sudo_password is not None)
                self._sudoers_user = self.user
            elif not sudo:
                _remove_sudoers(self.user)
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        _keygen(self.host_key_path, "vgpu-patch-test-host")
        if client_key is None:
            self.key_path = self.dir / "id_ed25519"
            _keygen(self.key_path, "vgpu-patch-test-client")
        else:
            self.key_path = Path(client_key).resolve()
        # sshd reads authorized_keys with the login user's rights, and pytest's tmp dirs are 0700:
        # keep it in a world-traversable dir of its own (removed at exit).
        self._keys_dir = Path(tempfile.mkdtemp(prefix="vgpu-sshd-keys-"))
        self._keys_dir.chmod(0o755)
        atexit.register(shutil.rmtree, self._keys_dir, True)
        self.authorized_keys = self._keys_dir / "authorized_keys"
        self.authorized_keys.write_text(Path(str(self.key_path) + ".pub").read_text())
        self.authorized_keys.chmod(0o644)
        self.config_path = self.dir / "sshd_config"
        self.log_path = self.dir / "sshd.log"
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config_path = self.dir / "ssh_config"
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------------
    def _write_config(self) -> None:
        self.config_path.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {self.host_key_path}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    "StrictModes no",
                    "UsePAM no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "AllowTcpForwarding yes",
                    "UseDNS no",
                    "PrintMotd no",
                    "MaxStartups 200:30:400",
                    "MaxSessions 64",
                    "LogLevel VERBOSE",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )

    def start(self) -> SSHD:
        if self.proc is not None:
            return self
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        last_err = ""
        for _ in range(5):  # a free port can be taken between probing and binding: retry
            if not self.port or last_err:
                self.port = _free_port()
            self.alias = self.alias or f"vgpu-node-{self.port}"
            self._write_config()
            log = open(self.log_path, "ab")  # noqa: SIM115 - sshd writes to it for its whole life
            self.proc = subprocess.Popen(
                [SSHD_BIN, "-D", "-e", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
            log.close()
            if self._wait_ready():
                self._write_client_files()
                return self
            last_err = self.log_path.read_text(errors="replace")[-500:]
            self._terminate()
        raise HarnessUnavailable(f"sshd did not start on 127.0.0.1: {last_err}")

    def _wait_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Stop the listener and every session it started."""
        if self.proc is not None:
            self.kill_sessions()
        self._terminate()

    def __enter__(self) -> SSHD:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._keys_dir, ignore_errors=True)

    def session_pids(self) -> list[int]:
        """Pids of the per-connection sshd processes (and their children) under this listener."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
        out: list[int] = []
        todo = list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def kill_sessions(self, children: bool = True) -> int:
        """SIGKILL every live connection; the listener keeps running. Returns how many processes.

        children=False kills only the sshd processes, leaving the commands they ran orphaned (as when
        the network drops but the node's shell carries on)."""
        pids = self.session_pids()
        if not children:
            pids = [p for p in pids if _comm(p) in ("sshd", "sshd-session")]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def rotate_host_key(self) -> None:
        """Restart on the same port with a fresh host key (the client's known_hosts is left stale)."""
        self.stop()
        for p in (self.host_key_path, Path(str(self.host_key_path) + ".pub")):
            p.unlink(missing_ok=True)
        _keygen(self.host_key_path, "vgpu-patch-test-host")
        stale = self.known_hosts.read_text() if self.known_hosts.exists() else ""
        self.start()
        if stale:
            self.known_hosts.write_text(stale)  # keep the old key: that is what "changed" means

    # -- client-side files ------------------------------------------------------------------------
    @property
    def host_key_line(self) -> str:
        """`[127.0.0.1]:PORT ssh-ed25519 AAAA...` as known_hosts stores it."""
        kind, blob = Path(str(self.host_key_path) + ".pub").read_text().split()[:2]
        return f"[{self.host}]:{self.port} {kind} {blob}"

    @property
    def host_key_fingerprint(self) -> str:
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key_path) + ".pub"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.split()[1]

    @property
    def target(self) -> str:
        """`user@127.0.0.1:port`, the `--host` form."""
        return f"{self.user}@{self.host}:{self.port}"

    def ssh_config_block(self) -> str:
        return (
            f"Host {self.alias}\n"
            f"    HostName {self.host}\n"
            f"    Port {self.port}\n"
            f"    User {self.user}\n"
            f"    IdentityFile {self.key_path}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes\n"
        )

    def _write_client_files(self) -> None:
        self.known_hosts.write_text(self.host_key_line + "\n")
        self.ssh_config_path.write_text(self.ssh_config_block())

    def ssh_command(self, *remote: str) -> list[str]:
        """argv running `remote` on this node with the OpenSSH client."""
        return ["ssh", "-F", str(self.ssh_config_path), self.alias, *remote]

    def inventory_vars(self) -> str:
        return (
            f"ansible_host={self.host} ansible_port={self.port} ansible_user={self.user} "
            f"ansible_ssh_private_key_file={self.key_path} "
            f"ansible_ssh_common_args='-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes'"
        )

    def inventory_ini(self, path: Path | str | None = None, group: str = "gpu") -> Path:
        """Write an Ansible INI inventory with this node in `group`; returns its path."""
        return inventory_ini([self], path or self.dir / "inventory.ini", group)


# -- fleets -------------------------------------------------------------------------------------
def inventory_ini(servers: Sequence[SSHD], path: Path | str, group: str = "gpu") -> Path:
    path = Path(path)
    lines = [f"[{group}]"] + [f"{s.alias} {s.inventory_vars()}" for s in servers]
    path.write_text("\n".join(lines) + "\n")
    return path


def inventory_yaml(servers: Sequence[SSHD], path: Path | str, group: str = "gpu") -> Path:
    import yaml

    hosts = {
        s.alias: {
            "ansible_host": s.host,
            "ansible_port": s.port,
            "ansible_user": s.user,
            "ansible_ssh_private_key_file": str(s.key_path),
        }
        for s in servers
    }
    path = Path(path)
    path.write_text(yaml.safe_dump({"all": {"children": {group: {"hosts": hosts}}}}))
    return path


def known_hosts_file(servers: Iterable[SSHD], path: Path | str) -> Path:
    path = Path(path)
    path.write_text("".join(s.host_key_line + "\n" for s in servers))
    return path


def ssh_config_file(servers: Iterable[SSHD], path: Path | str) -> Path:
    path = Path(path)
    path.write_text("\n".join(s.ssh_config_block() for s in servers))
    return path


def start_many(n: int, base_dir: Path | str, **kw: object) -> list[SSHD]:
    """Start n servers sharing one client key (the first one's). Caller stops them."""
    base = Path(base_dir)
    first = SSHD(base / "node0", **kw)  # type: ignore[arg-type]
    kw = {**kw, "client_key": first.key_path}
    with ThreadPoolExecutor(max_workers=8) as pool:
        rest = list(pool.map(lambda i: SSHD(base / f"node{i}", **kw), range(1, n)))  # type: ignore[arg-type]
    return [first, *rest]
