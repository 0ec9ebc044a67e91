"""The SSH backend (paramiko): lazy connect, known_hosts checking, ProxyJump/ProxyCommand, sudo with a pty.

Host keys are checked against the user's known_hosts files and the global ones (/etc/ssh/ssh_known_hosts),
read by known_hosts.py (hashed names, patterns, `@revoked` refused, `@cert-authority` skipped). An unknown
key is refused (HostKeyError naming the fingerprint and `--accept-new-host-keys`) unless
`accept_new_host_keys`, which appends it to the first user file (TOFU). A changed or revoked key is
always refused. With a become password, sudo asks at a fixed prompt and the password is sent only when
that prompt appears; a second prompt means sudo rejected it (AuthFailure).
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import paramiko

from ..report.errors import AuthFailure, ConnectionFailure, DeployError, HostKeyError
from .base import SUDO_MARKER, SUDO_PROMPT, Result, Stream, Timed, Transport, describe, sudo_unwrap, sudo_wrap
from .known_hosts import KnownHosts, lookup_name
from .sshconfig import DEFAULT_GLOBAL_KNOWN_HOSTS

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_NO_KEY = "No authentication methods available"
_CHUNK = 32768


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """A key not known for this host: refuse it (revoked, or unknown), or record it when first use is accepted."""

    def __init__(self, known_hosts: Path, accept_new: bool, lock: threading.Lock, kh: KnownHosts, name: str) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.lock = lock
        self.kh = kh
        self.name = name

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        bad = self.kh.revoked(key.asbytes())
        if bad is not None:
            raise HostKeyError(
                f"{hostname}: host key {key.get_name()} {fp} is marked @revoked in {bad.where}; refusing: "
                f"the node's key was withdrawn, get its new key from its administrator"
            )
        if not self.accept_new:
            files = ", ".join(self.kh.files) or str(self.known_hosts)
            ca = (" (a @cert-authority line covers this host, but host certificates are not verified here: "
                  "add the host key itself)") if self.kh.has_cert_authority_for(self.name) else ""
            raise HostKeyError(
                f"{hostname}: unknown host key {key.get_name()} {fp} (not in {files}){ca}; "
                f"verify it, then add it or rerun with --accept-new-host-keys"
            )
        with self.lock:  # fleet runs append from many threads
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.known_hosts, "a") as f:
                f.write(f"{self.name} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


_KNOWN_HOSTS_LOCK = threading.Lock()


def _files_with_key(kh: KnownHosts, name: str, key: paramiko.PKey) -> list[str]:
    """The known_hosts files whose lines for `name` hold `key`, in the order they are read."""
    blob = key.asbytes()
    files = [e.where.rsplit(":", 1)[0] for e in kh.for_host(name) if e.key_blob == blob]
    return list(dict.fromkeys(files))


def forget_command(name: str, files: Sequence[str]) -> str:
    """The exact `ssh-keygen -R` that removes `name`'s lines from `files` (`-f` unless it is ssh's own default)."""
    default = os.path.expanduser(DEFAULT_KNOWN_HOSTS)
    return " && ".join(f"ssh-keygen -R {shlex.quote(name)}"
                       + ("" if os.path.abspath(f) == default else f" -f {shlex.quote(f)}") for f in files)


def _open_private(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPFile:
    """SFTP open(2) with O_CREAT|O_EXCL|O_WRONLY and mode 0600 in the request (paramiko's open sends no mode)."""
    from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_WRITE

    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = 0o600
    flags = SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL
    t, msg = sftp._request(CMD_OPEN, path, flags, attrs)  # type: ignore[attr-defined]
    if t != CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb", -1)


class SSHTransport(Transport):
    """One node over SSH. Connects on first use; `close()` drops the connection (and the jump's)."""

    def __init__(
        self,
        hostname: str,
        *,
        port: int = 22,
        user: str | None = None,
        key_filenames: Sequence[str] = (),
        known_hosts: Path | str | Sequence[str] | None = None,
        global_known_hosts: Sequence[str] | None = None,
        accept_new_host_keys: bool = False,
        jump: SSHTransport | None = None,
        proxy_command: str | None = None,
        host_key_alias: str | None = None,
        become_password: str | None = None,
        connect_timeout: float = 15.0,
        allow_agent: bool = True,
        name: str | None = None,
        pty_for_sudo: bool | None = None,
        use_sudo: bool | None = None,
        command_timeout: float | None = None,
    ) -> None:
        self.command_timeout = command_timeout
        self.hostname = hostname
        self.port = port
        self.user = user or os.environ.get("USER") or "root"
        self.key_filenames = [os.path.expanduser(k) for k in key_filenames]
        if isinstance(known_hosts, (str, Path)):
            files = [str(known_hosts)]
        else:
            files = list(known_hosts or [DEFAULT_KNOWN_HOSTS])
        self.user_known_hosts = [os.path.expanduser(f) for f in files]
        self.known_hosts = Path(self.user_known_hosts[0])  # where an accepted new key is written
        gkh = DEFAULT_GLOBAL_KNOWN_HOSTS if global_known_hosts is None else global_known_hosts
        self.global_known_hosts = list(gkh)
        self.proxy_command = proxy_command
        self.host_key_alias = host_key_alias
        self.become_password = become_password
        self.accept_new_host_keys = accept_new_host_keys
        self.jump = jump
        self.connect_timeout = connect_timeout
        self.allow_agent = allow_agent
        # None: sudo without a terminal, then (once, remembered) with one if sudoers says `requiretty`
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
            kh = KnownHosts.load([*self.user_known_hosts, *self.global_known_hosts])
            # OpenSSH looks a HostKeyAlias up as written (no port), else `[host]:port` off port 22
            name = self.host_key_alias or lookup_name(self.hostname, self.port)
            as_paramiko = lookup_name(self.hostname, self.port)  # the name paramiko looks the key up by
            for e in kh.for_host(name):
                try:
                    key = paramiko.PKey.from_type_string(e.key_type, e.key_blob)
                    client.get_host_keys().add(as_paramiko, e.key_type, key)
                except (paramiko.SSHException, ValueError, TypeError):
                    continue  # a key type paramiko does not know: OpenSSH would not offer it either
            client.set_missing_host_key_policy(
                _HostKeyPolicy(self.known_hosts, self.accept_new_host_keys, _KNOWN_HOSTS_LOCK, kh, name)
            )
            missing = [k for k in self.key_filenames if not os.path.exists(k)]
            if missing:
                raise AuthFailure(f"{self.name}: identity file {missing[0]} does not exist; fix IdentityFile, "
                                  f"ansible_ssh_private_key_file or -i")
            sock: paramiko.ProxyCommand | paramiko.Channel | None = None
            if self.proxy_command:
                try:
                    sock = paramiko.ProxyCommand(self.proxy_command)
                except (OSError, paramiko.SSHException) as e:
                    raise ConnectionFailure(
                        f"{self.name}: ProxyCommand {self.proxy_command!r} could not start ({e}); fix ProxyCommand"
                    ) from e
            elif self.jump is not None:
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
                with Timed(self.name, "connect", f"{self.user}@{self.hostname}:{self.port}"
                           + (f" via {self.proxy_command!r}" if self.proxy_command else "")
                           + (f" via {self.jump.name}" if self.jump else "")
                           + f" (timeout {self.connect_timeout:g} s)"):
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
                files = _files_with_key(kh, name, e.expected_key) or [str(self.known_hosts)]
                raise HostKeyError(
                    f"{self.name}: host key CHANGED (got {fingerprint(e.key)}, {', '.join(files)} has "
                    f"{fingerprint(e.expected_key)}); refusing: possible impersonation. If the node was "
                    f"reinstalled, verify its new key, then remove the old one: {forget_command(name, files)}"
                ) from e
            except paramiko.AuthenticationException as e:
                client.close()
                raise AuthFailure(
                    f"{self.name}: SSH authentication refused for {self.user} ({e}); check the key, agent or User"
                ) from e
            except (OSError, paramiko.SSHException, EOFError) as e:
                client.close()
                if str(e) == _NO_KEY:  # paramiko: neither a key file nor the agent had a key to offer
                    raise AuthFailure(self._no_key_offered()) from e
                via = f" through ProxyCommand {self.proxy_command!r}" if self.proxy_command else ""
                raise ConnectionFailure(
                    f"{self.name}: cannot connect{via} ({e or type(e).__name__}); check host, port and network"
                ) from e
            self._client = client
            return client

    def _no_key_offered(self) -> str:
        agent = "no ssh-agent (SSH_AUTH_SOCK unset)" if not os.environ.get("SSH_AUTH_SOCK") else (
            "an ssh-agent holding no key" if self.allow_agent else "the agent not used")
        return (f"{self.name}: no SSH key was offered for {self.user} (no -i, no IdentityFile, no default key in "
                f"~/.ssh, {agent}); give one with -i KEY, IdentityFile in ~/.ssh/config or the inventory's "
                f"ansible_ssh_private_key_file, or load it with ssh-add")

    def _lost(self, doing: str, e: BaseException | None = None) -> ConnectionFailure:
        """The link is gone: drop the client (the next use re-dials) and say what was cut off."""
        self.close()
        why = f" ({e})" if e is not None else ""
        return ConnectionFailure(f"{self.name}: connection lost {doing}{why}; rerun")

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
        timeout = self.limit(timeout)
        with Timed(self.name, "run (sudo)" if sudo else "run", describe(cmd)) as t:
            result = self._run_sudo_or_tty(cmd, sudo=sudo, warn=warn, timeout=timeout)
            t.end(f"exit {result.exited}")
            return result

    def _run_sudo_or_tty(self, cmd: str, *, sudo: bool, warn: bool, timeout: float | None) -> Result:
        if not (self._needs_sudo(sudo) and self.pty_for_sudo is None):
            return self._run(cmd, sudo=sudo, warn=warn, timeout=timeout)
        try:
            return self._run(cmd, sudo=sudo, warn=warn, timeout=timeout, pty=False)
        except AuthFailure as e:
            if "tty" not in str(e):  # sudo's "you must have a tty": sudoers has `requiretty`
                raise
        self.pty_for_sudo = True  # sudo refused before running anything: retrying is safe
        return self._run(cmd, sudo=sudo, warn=warn, timeout=timeout)

    def _run(self, cmd: str, *, sudo: bool, warn: bool, timeout: float | None, pty: bool | None = None) -> Result:
        wrapped = self._needs_sudo(sudo)
        use_pty = wrapped and bool(self.pty_for_sudo if pty is None else pty)  # sudoers `requiretty` needs one
        password = self.become_password if wrapped else None
        full = sudo_wrap(cmd, password=password is not None, stdin=not use_pty) if wrapped else cmd
        client = self._connect()
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]
            if use_pty:
                # a wide terminal, no echo surprises: output is only what the script prints
                chan.get_pty(term="dumb", width=500, height=50)
            chan.settimeout(timeout)
            chan.exec_command(full)
            watching = password is not None and use_pty  # send it at sudo's prompt (echo off), once
            if password is not None and not use_pty:
                chan.sendall((password + "\n").encode())  # sudo -S reads one line from stdin
            if not watching:
                chan.shutdown_write()
            out, err = bytearray(), bytearray()
            sent = False
            while True:  # stdout to EOF, draining stderr as it comes so neither stream stalls the window
                data = chan.recv(_CHUNK)
                if not data:
                    break
                out += data
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
                if watching:
                    text = out.decode(errors="replace")
                    if SUDO_MARKER in text:
                        watching = False
                        chan.shutdown_write()
                    elif text.count(SUDO_PROMPT.strip()) > (1 if sent else 0):
                        if sent:  # asked again: the password was wrong
                            chan.close()
                            raise AuthFailure(f"{self.name}: sudo rejected the password given with "
                                              f"--ask-become-pass; check it and rerun (nothing changed)")
                        chan.sendall((password + "\n").encode())  # type: ignore[operator]
                        sent = True
            while True:
                data = chan.recv_stderr(_CHUNK)
                if not data:
                    break
                err += data
            code = chan.recv_exit_status()
            chan.close()
        except AuthFailure:
            raise
        except socket.timeout as e:
            raise DeployError(f"{self.name}: command timed out after {timeout}s: {cmd.splitlines()[0][:80]}") from e
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._lost("while running a command", e) from e
        if code == -1:  # the session died without an exit status: sshd killed, network gone
            raise self._lost("while running a command")
        stdout = out.decode(errors="replace")
        stderr = err.decode(errors="replace")
        if use_pty:
            stdout = stdout.replace("\r\n", "\n")
        result = Result(code == 0, code, stdout, stderr, cmd)
        if wrapped:
            result = sudo_unwrap(self.name, result)
        return self._check(result, warn)

    def open_stream(self, cmd: str, *, sudo: bool = False, timeout: float | None = None) -> Stream | None:
        """One exec channel whose stdin stays open. None where sudo needs a password or a terminal: a
        password would be read from the same stdin, and a pty would mangle binary input."""
        wrapped = self._needs_sudo(sudo)
        if wrapped and (self.become_password is not None or self.pty_for_sudo):
            return None
        timeout = self.limit(timeout)
        full = sudo_wrap(cmd, stdin=True) if wrapped else cmd
        client = self._connect()
        timed = Timed(self.name, "session (sudo)" if sudo else "session", describe(cmd))
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]
            chan.settimeout(timeout)
            chan.exec_command(full)
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._lost("while starting a command", e) from e
        err = bytearray()

        def recv(n: int) -> bytes:
            try:
                data = chan.recv(n)
                while chan.recv_stderr_ready():  # drained as it comes: neither stream may stall the window
                    err.extend(chan.recv_stderr(_CHUNK))
                return data
            except socket.timeout as e:
                raise DeployError(f"{self.name}: the node did not answer within {timeout}s; rerun") from e
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise self._lost("while running a command", e) from e

        def send(data: bytes) -> None:
            try:
                chan.sendall(data)
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise self._lost("while sending to the node", e) from e

        def close_input() -> None:
            with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                chan.shutdown_write()

        def wait() -> tuple[int, str]:
            try:
                while True:
                    data = chan.recv_stderr(_CHUNK)
                    if not data:
                        break
                    err.extend(data)
                code = chan.recv_exit_status()
            except (OSError, paramiko.SSHException, EOFError) as e:
                timed.end(f"failed: {e}")
                raise self._lost("while running a command", e) from e
            timed.end(f"exit {code}")
            chan.close()
            if code == -1:  # the session died without an exit status: sshd killed, network gone
                raise self._lost("while running a command")
            return code, err.decode(errors="replace")

        stream = Stream(self.name, recv=recv, send=send, close_input=close_input, wait=wait, wrapped=wrapped,
                        command=cmd)
        if wrapped and self.pty_for_sudo is None:
            try:  # sudo's first word: its marker, or a refusal (a `requiretty` refusal: use a terminal instead)
                stream.read_until(SUDO_MARKER)
            except AuthFailure as e:
                if "tty" not in str(e):
                    raise
                self.pty_for_sudo = True  # sudo refused before running anything: the caller falls back
                return None
        return stream

    # -- files -------------------------------------------------------------------------------
    def put(self, local_path: Path | str, remote_path: str) -> None:
        client = self._connect()
        try:
            sftp = client.open_sftp()
            try:
                # O_EXCL and mode 0600 from the start: never reuse a pre-planted file in a shared /tmp,
                # and never let another user read (or race) a half-written upload
                with open(local_path, "rb") as src, _open_private(sftp, remote_path) as dst:
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
            raise self._lost(f"during upload to {remote_path}", e) from e
        except OSError as e:
            if not self._alive():
                raise self._lost(f"during upload to {remote_path}", e) from e
            raise DeployError(
                f"{self.name}: upload to {remote_path} failed ({e}); check free space and permissions") from e

    def redial_quickly(self, timeout: float = 5.0) -> None:
        """Reconnect with a short timeout (to clean up after a dropped link); raises if that fails too."""
        self.close()
        saved, self.connect_timeout = self.connect_timeout, min(self.connect_timeout, timeout)
        try:
            self._connect()
        finally:
            self.connect_timeout = saved

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
            raise self._lost(f"during download of {remote_path}", e) from e
