"""A kubeconfig user's `exec` credential plugin, run as client-go runs it (EKS's `aws eks get-token`, GKE's
`gke-gcloud-auth-plugin`, AKS's and OIDC's `kubelogin`).

The protocol (client.authentication.k8s.io, v1 and v1beta1): the plugin runs with the user's `args` and `env` added
to ours and `KUBERNETES_EXEC_INFO` holding an ExecCredential request (`spec.interactive`: false here, as nothing
is typed; `spec.cluster` when `provideClusterInfo`); it prints an ExecCredential whose `status` holds a bearer
`token`, or `clientCertificateData` and `clientKeyData` (PEM), and maybe an `expirationTimestamp`. The answer is
kept until it expires, and asked for again when the API server answers 401. A `command` with a slash and no
leading one is relative to the kubeconfig file's directory; a bare name is looked up on PATH. Every failure is one
line naming the user, the command and what to do.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..report import verbosity
from ..report.errors import DeployError, UsageError
from .tls_files import private_file

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
EXEC_EXTENSION = "client.authentication.k8s.io/exec"  # a cluster's `extensions` entry passed as spec.cluster.config
TIMEOUT_S = 120.0
EARLY_S = 10.0  # ask again this long before the credential expires


class ExecCredentialError(DeployError):
    """A kubeconfig `exec` plugin could not be run, failed, or printed no usable credential (a malformed `exec`
    section is a UsageError)."""


@dataclass
class Credential:
    token: str | None = None
    cert_file: str | None = None  # PEM files written from the plugin's data, 0600, removed at exit
    key_file: str | None = None
    expires: float | None = None  # epoch seconds; None: until the server says 401


@dataclass
class ExecPlugin:
    user: str  # the kubeconfig user's name
    command: str
    api_version: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    install_hint: str = ""
    interactive_mode: str = "IfAvailable"
    cluster_info: dict[str, Any] | None = None  # spec.cluster, when the user asks for provideClusterInfo
    timeout: float = TIMEOUT_S
    runs: int = 0  # how many times the plugin ran (the cache's effect, for tests and -v)
    _cached: Credential | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_kubeconfig(cls, user: str, spec: Any, cluster: dict[str, Any], base_dir: Path) -> ExecPlugin:
        """The plugin a kubeconfig user's `exec` section names; ExecCredentialError for a malformed one."""
        where = f"kubeconfig user {user!r}: exec"
        if not isinstance(spec, dict) or not isinstance(spec.get("command"), str) or not spec["command"]:
            raise UsageError(f"{where} has no command; fix the kubeconfig (users[].user.exec.command)")
        version = spec.get("apiVersion")
        if version not in API_VERSIONS:
            raise UsageError(f"{where} apiVersion {version!r} is not one this tool speaks "
                                      f"({', '.join(API_VERSIONS)}); update the kubeconfig's exec section")
        mode = spec.get("interactiveMode") or "IfAvailable"
        if mode not in INTERACTIVE_MODES:
            raise UsageError(f"{where} interactiveMode {mode!r}: one of {', '.join(INTERACTIVE_MODES)}")
        command = spec["command"]
        if "/" in command and not os.path.isabs(command):
            command = str(base_dir / command)  # client-go: relative to the kubeconfig that names it
        env: dict[str, str] = {}
        for item in spec.get("env") or []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise UsageError(f"{where} env entries need a name and a value; fix the kubeconfig")
            env[item["name"]] = str(item.get("value") or "")
        args = [str(a) for a in spec.get("args") or []]
        info = _cluster_info(cluster) if spec.get("provideClusterInfo") else None
        return cls(user, command, version, args, env, str(spec.get("installHint") or "").strip(), mode, info)

    def credential(self) -> Credential:
        """The kept credential while it is valid, else the plugin's fresh one."""
        with self._lock:
            c = self._cached
            if c is not None and (c.expires is None or time.time() < c.expires - EARLY_S):
                return c
            self._cached = self._run()
            return self._cached

    def forget(self) -> None:
        """The server refused the kept credential (401): the next request runs the plugin again."""
        with self._lock:
            self._cached = None

    def _run(self) -> Credential:
        what = f"kubeconfig user {self.user!r}: exec plugin {self.command}"
        if self.interactive_mode == "Always":
            raise ExecCredentialError(f"{what} wants a terminal (interactiveMode Always), and none is offered; log "
                                      "in with kubectl once, or run kubectl proxy and pass --api-server "
                                      "http://127.0.0.1:8001")
        request: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential",
                                   "spec": {"interactive": False}}
        if self.cluster_info is not None:
            request["spec"]["cluster"] = self.cluster_info
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(request)}
        self.runs += 1
        try:
            with verbosity.step("kube", f"exec credential plugin of user {self.user}", self.command):
                proc = subprocess.run([self.command, *self.args], env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, text=True, timeout=self.timeout)
        except FileNotFoundError as e:
            hint = f" ({' '.join(self.install_hint.split())})" if self.install_hint else ""
            raise ExecCredentialError(f"{what} not found{hint}; install it, or fix the kubeconfig's "
                                      "exec.command") from e
        except PermissionError as e:
            raise ExecCredentialError(f"{what} cannot be run ({e.strerror}); make it executable") from e
        except subprocess.TimeoutExpired as e:
            raise ExecCredentialError(f"{what} gave no credential in {self.timeout:g} s; run it by hand to see "
                                      "what it waits for") from e
        if proc.stderr:  # what the plugin says to the user goes to the user, as kubectl passes it on
            sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            last = next((ln.strip() for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "no message")
            raise ExecCredentialError(f"{what} exited {proc.returncode}: {last[:300]}; run it by hand (log in "
                                      "again?), then retry")
        return self._parse(proc.stdout, what)

    def _parse(self, out: str, what: str) -> Credential:
        try:
            doc = json.loads(out)
        except ValueError as e:
            raise ExecCredentialError(f"{what} printed no ExecCredential JSON ({e}); check the plugin") from e
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise ExecCredentialError(f"{what} printed something other than an ExecCredential; check the plugin")
        if doc.get("apiVersion") != self.api_version:
            raise ExecCredentialError(f"{what} answered in {doc.get('apiVersion')!r}, but the kubeconfig asks for "
                                      f"{self.api_version!r}; make exec.apiVersion the plugin's")
        status = doc.get("status")
        if not isinstance(status, dict):
            raise ExecCredentialError(f"{what} printed an ExecCredential without a status; check the plugin")
        token, cert, key = status.get("token"), status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert and key):
            raise ExecCredentialError(f"{what} gave neither a token nor a client certificate and key; check the "
                                      "plugin")
        cred = Credential(token=str(token) if token else None, expires=_expiry(status.get("expirationTimestamp"),
                                                                                   what))
        if cert and key:
            cred.cert_file, cred.key_file = _pem_file(str(cert), ".crt"), _pem_file(str(key), ".key")
        return cred


def _cluster_info(cluster: dict[str, Any]) -> dict[str, Any]:
    """spec.cluster: the server, its CA (base64 data, read from a file if need be), TLS settings, the exec config."""
    info: dict[str, Any] = {"server": cluster.get("server") or ""}
    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        import base64

        try:
            ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
        except OSError as e:
            raise UsageError(f"kubeconfig: cannot read certificate-authority {e.filename} "
                                      f"({e.strerror}); fix the path") from e
    if ca:
        info["certificate-authority-data"] = ca
    for key, name in (("insecure-skip-tls-verify", "insecure-skip-tls-verify"), ("tls-server-name", "tls-server-name"),
                      ("proxy-url", "proxy-url")):
        if cluster.get(key):
            info[name] = cluster[key]
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == EXEC_EXTENSION:
            info["config"] = ext.get("extension")
    return info


def _expiry(stamp: Any, what: str) -> float | None:
    if not stamp:
        return None
    try:
        when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError as e:
        raise ExecCredentialError(f"{what} gave expirationTimestamp {stamp!r}, not RFC 3339; check the "
                                  "plugin") from e
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _pem_file(text: str, suffix: str) -> str:
    """ssl wants files: the plugin's PEM in a 0600 temp file, removed when the process exits."""
    return private_file(text.encode(), "vgpu-patch-exec-", suffix)
