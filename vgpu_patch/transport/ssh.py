"""The SSH backend (paramiko): lazy connect, known_hosts checking, ProxyJump, `sudo -n` with a pty.

Host keys are checked against a known_hosts file. An unknown key is refused (HostKeyError naming the
fingerprint and `--accept-new-host-keys`) unless `accept_new_host_keys`, which appends it (TOFU).
A changed key is always refused.
"""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import paramiko

from ..errors import AuthFailure, ConnectionFailure, DeployError, HostKeyError
from .base import Result, Transport, sudo_unwrap, sudo_wrap

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_CHUNK = 32768


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse, or record it when first use is accepted."""

    def __init__(self, known_hosts: Path, accept_new: bool, lock: threading.Lock) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.lock = lock

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyError(
                f"{hostname}: unknown host key {key.get_name()} {fp} (not in {self.known_hosts}); "
                f"verify it, then add it or rerun with --accept-new-host-keys"
            )
        with self.lock:  # fleet runs append from many threads
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.known_hosts, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


_KNOWN_HOSTS_LOCK = threading.Lock()


class SSHTransport(Transport):
    """One node over SSH. Connects on first use; `close()` drops the connection (and the jump's)."""

    def __init__(
        self,
        hostname: str,
        *,
        port: int = 22,
        user: str | None = None,
        key_filenames: Sequence[str] = (),
        known_hosts: Path | str | None = None,
        accept_new_host_keys: bool = False,
        jump: SSHTransport | None = None,
        connect_timeout: float = 15.0,
        allow_agent: bool = True,
        name: str | None = None,
        pty_for_sudo: bool = True,
        use_sudo: bool | None = None,
    ) -> None:
        self.hostname = hostname
        self.port = port
        self.user = user or os.environ.get("USER") or "root"
        self.key_filenames = [os.path.expanduser(k) for k in key_filenames]
        self.known_hosts = Path(os.path.expanduser(str(known_hosts or DEFAULT_KNOWN_HOSTS)))
        self.accept_new_host_keys = accept_new_host_keys
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.allow_agent = allow_agent
        self.pty_for_sudo = pty_for_sudo
        # None: sudo for privileged steps unless logged in as root; False: the login user does them
        self.use_sudo = use_sudo
        self.name = name or f"{self.user}@{hostname}" + ("" if port == 22 else f":{port}")
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------------------
    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            live = self._client.get_transport() if self._client is not None else None
            if self._client is not None and live is not None and live.is_active():
                return self._client
            client = paramiko.SSHClient()
            if self.known_hosts.exists():
                try:
                    client.load_host_keys(str(self.known_hosts))
                except (OSError, paramiko.SSHException) as e:
                    raise HostKeyError(f"{self.name}: cannot read {self.known_hosts}: {e}; "
                                       "fix or pass --known-hosts") from e
            client.set_missing_host_key_policy(
                _HostKeyPolicy(self.known_hosts, self.accept_new_host_keys, _KNOWN_HOSTS_LOCK)
            )
            missing = [k for k in self.key_filenames if not os.path.exists(k)]
            if missing:
                raise AuthFailure(f"{self.name}: identity file {missing[0]} does not exist; fix IdentityFile, "
                                  f"ansible_ssh_private_key_file or -i")
            sock = None
            if self.jump is not None:
                try:
                    jt = self.jump._connect().get_transport()
                    assert jt is not None
                    sock = jt.open_channel("direct-tcpip", (self.hostname, self.port), ("127.0.0.1", 0))
                except paramiko.ChannelException as e:
                    raise ConnectionFailure(
                        f"{self.name}: jump host {self.jump.name} could not reach {self.hostname}:{self.port} "
                        f"({e}); check ProxyJump and AllowTcpForwarding"
                    ) from e
            try:
                client.connect(
                    self.hostname,
                    port=self.port,
                    username=self.user,
                    key_filename=self.key_filenames or None,  # type: ignore[arg-type]  # a list works too
                    look_for_keys=not self.key_filenames,
                    allow_agent=self.allow_agent,
                    timeout=self.connect_timeout,
                    banner_timeout=self.connect_timeout,
                    auth_timeout=self.connect_timeout,
                    sock=sock,
                )
            except HostKeyError:
                client.close()
                raise
            except paramiko.BadHostKeyException as e:
                client.close()
                raise HostKeyError(
                    f"{self.name}: host key CHANGED (got {fingerprint(e.key)}, {self.known_hosts} has "
                    f"{fingerprint(e.expected_key)}); refusing: possible impersonation. If the node was "
                    f"reinstalled, remove the old key with ssh-keygen -R"
                ) from e
            except paramiko.AuthenticationException as e:
                client.close()
                raise AuthFailure(
                    f"{self.name}: SSH authentication refused for {self.user} ({e}); check the key, agent or User"
                ) from e
            except (OSError, paramiko.SSHException, EOFError) as e:
                client.close()
                raise ConnectionFailure(f"{self.name}: cannot connect ({e or type(e).__name__}); "
                                        "check host, port and network") from e
            self._client = client
            return client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- commands -------------------------------------------------------------------------------
    def _needs_sudo(self, sudo: bool) -> bool:
        if not sudo or self.use_sudo is False:
            return False
        return self.use_sudo is True or self.user != "root"

    def run(self, cmd: str, *, sudo: bool = False, warn: bool = False, timeout: float | None = None) -> Result:
        wrapped = self._needs_sudo(sudo)
        full = sudo_wrap(cmd) if wrapped else cmd
        use_pty = wrapped and self.pty_for_sudo  # sudoers `requiretty` needs a terminal
        client = self._connect()
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]
            if use_pty:
                # a wide terminal, no echo surprises: output is only what the script prints
                chan.get_pty(term="dumb", width=500, height=50)
            chan.settimeout(timeout)
            chan.exec_command(full)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:  # stdout to EOF, draining stderr as it comes so neither stream stalls the window
                data = chan.recv(_CHUNK)
                if not data:
                    break
                out += data
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
            while True:
                data = chan.recv_stderr(_CHUNK)
                if not data:
                    break
                err += data
            code = chan.recv_exit_status()
            chan.close()
        except socket.timeout as e:
            raise DeployError(f"{self.name}: command timed out after {timeout}s: {cmd.splitlines()[0][:80]}") from e
        except (OSError, paramiko.SSHException, EOFError) as e:
            self.close()
            raise ConnectionFailure(f"{self.name}: connection lost while running a command ({e}); rerun") from e
        if code == -1:  # the session died without an exit status: sshd killed, network gone
            self.close()
            raise ConnectionFailure(f"{self.name}: connection lost while running a command; rerun")
        stdout = out.decode(errors="replace")
        stderr = err.decode(errors="replace")
        if use_pty:
            stdout = stdout.replace("\r\n", "\n")
        result = Result(code == 0, code, stdout, stderr, cmd)
        if wrapped:
            result = sudo_unwrap(self.name, result)
        return self._check(result, warn)

    # -- files -------------------------------------------------------------------------------
    def put(self, local_path: Path | str, remote_path: str) -> None:
        client = self._connect()
        try:
            sftp = client.open_sftp()
            try:
                # "x": O_EXCL, never follow or reuse a pre-planted file in a shared /tmp
                with open(local_path, "rb") as src, sftp.open(remote_path, "wbx") as dst:
                    dst.set_pipelined(True)
                    while True:
                        chunk = src.read(_CHUNK)
                        if not chunk:
                            break
                        dst.write(chunk)
                    # close() waits for every pipelined write's status: errors (ENOSPC) surface here
            finally:
                sftp.close()
        except (paramiko.SSHException, EOFError) as e:
            self.close()
            raise ConnectionFailure(f"{self.name}: connection lost during upload to {remote_path} ({e}); rerun") from e
        except OSError as e:
            if not self._alive():
                self.close()
                raise ConnectionFailure(
                    f"{self.name}: connection lost during upload to {remote_path} ({e}); rerun") from e
            raise DeployError(f"{self.name}: upload to {remote_path} failed ({e}); "
                              "check free space and permissions") from e

    def _alive(self) -> bool:
        t = self._client.get_transport() if self._client is not None else None
        return bool(t is not None and t.is_active())

    def get(self, remote_path: str, local_path: Path | str) -> None:
        client = self._connect()
        try:
            sftp = client.open_sftp()
            try:
                sftp.get(remote_path, str(local_path))
            finally:
                sftp.close()
        except OSError as e:
            raise DeployError(f"{self.name}: download of {remote_path} failed ({e})") from e
        except (paramiko.SSHException, EOFError) as e:
            self.close()
            raise ConnectionFailure(
                f"{self.name}: connection lost during download of {remote_path} ({e}); rerun") from e
