"""A small Kubernetes API client over plain HTTPS (standard library only: the agent image stays lean).

Configuration, first match wins:
- explicit `server` (+ `token` / `token_file`, `ca_file`, `insecure`): tests, or `kubectl proxy` at
  http://127.0.0.1:8001, which handles every authentication a kubeconfig can name;
- in-cluster: KUBERNETES_SERVICE_HOST/PORT and the pod's service-account token and CA;
- a kubeconfig (`--kubeconfig`, $KUBECONFIG, ~/.kube/config): its current context's server, CA, bearer
  token or client certificate, or an `exec` credential plugin run as client-go runs it (exec_credential.py:
  EKS, GKE, AKS, OIDC); a legacy `auth-provider` user is refused with a hint to move to its exec plugin.
Every failure is an `ApiError` with a one-line message naming the request.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report import verbosity
from ..report.errors import DeployError, UsageError
from .exec_credential import ExecPlugin
from .tls_files import private_file

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(DeployError):
    """A Kubernetes API request failed (network, authentication, RBAC, or the server said no)."""

    def __init__(self, message: str, status: int | None = None, body: dict | None = None, *,
                 transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}
        self.transient = transient or status in RETRY_STATUS  # worth asking again after a pause


RETRY_STATUS = (429, 500, 502, 503, 504)


@dataclass
class Client:
    server: str
    token: str | None = None
    token_file: Path | None = None  # re-read on every request: projected tokens rotate
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    timeout: float = 10.0
    read_retries: int = 3  # a GET that fails transiently is asked again after 0.25, 0.5, 1 s
    retry_base: float = 0.25
    exec_plugin: ExecPlugin | None = None  # a kubeconfig user's credential plugin: token or client certificate

    def _context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https:"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        cert, key = self.cert_file, self.key_file
        if self.exec_plugin is not None:
            cred = self.exec_plugin.credential()
            if cred.cert_file:
                cert, key = cred.cert_file, cred.key_file
        if cert:
            ctx.load_cert_chain(cert, key)
        return ctx

    def _token(self) -> str | None:
        if self.exec_plugin is not None:
            token = self.exec_plugin.credential().token
            if token:
                return token
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as e:
                raise ApiError(f"cannot read the service-account token {self.token_file}: {e.strerror}") from e
        return self.token

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                query: dict[str, str] | None = None, ok: tuple[int, ...] = (200, 201)) -> dict:
        """One API call; a GET (safe to repeat) is retried with backoff on 429, 5xx or no answer."""
        retries, attempt, renewed = (self.read_retries if method == "GET" else 0), 0, False
        while True:
            try:
                return self._once(method, path, body, content_type, query, ok)
            except ApiError as e:
                if e.status == 401 and self.exec_plugin is not None and not renewed:
                    self.exec_plugin.forget()  # expired or revoked early: the plugin's next answer, once
                    renewed = True
                    continue
                if attempt >= retries or not e.transient:
                    raise
                time.sleep(self.retry_base * 2 ** attempt)
                attempt += 1

    def _once(self, method: str, path: str, body: Any, content_type: str, query: dict[str, str] | None,
              ok: tuple[int, ...]) -> dict:
        url = self.server.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        token = self._token()
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with verbosity.step("kube", f"{method} {path}", self.server), \
                    urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        except (urllib.error.URLError, OSError, ssl.SSLError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(f"{method} {path}: cannot reach the API server {self.server}: {reason}",
                           transient=True) from e
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"message": raw[:200].decode(errors="replace")}
        if status not in ok:
            msg = doc.get("message") if isinstance(doc, dict) else None
            raise ApiError(f"{method} {path}: HTTP {status}: {msg or 'no message'}", status,
                           doc if isinstance(doc, dict) else {})
        return doc if isinstance(doc, dict) else {}

    # -- the few calls the tool makes ------------------------------------------------------------
    def get_node(self, name: str) -> dict:
        return self.request("GET", f"/api/v1/nodes/{_q(name)}")

    def list_nodes(self, label_selector: str | None = None) -> list[dict]:
        q = {"labelSelector": label_selector} if label_selector else None
        return list(self.request("GET", "/api/v1/nodes", query=q).get("items") or [])

    def annotate_node(self, name: str, annotations: dict[str, str | None]) -> dict:
        """Merge-patch the node's annotations (a None value removes one)."""
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}", {"metadata": {"annotations": annotations}},
                            content_type="application/merge-patch+json")

    def node_event(self, node: str, event_type: str, reason: str, message: str) -> dict:
        """A core/v1 Event about the Node (namespace default, where node events live): `kubectl describe node`."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": "vgpu-patch-agent.", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
                "type": event_type, "reason": reason, "message": message[:1024],
                "source": {"component": "vgpu-patch-agent", "host": node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        return self.request("POST", "/api/v1/namespaces/default/events", body)

    def pods_on_node(self, node: str) -> list[dict]:
        q = {"fieldSelector": f"spec.nodeName={node}"}
        return list(self.request("GET", "/api/v1/pods", query=q).get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def evict(self, namespace: str, name: str, uid: str | None = None, *, dry_run: bool = False) -> dict:
        """POST an Eviction (policy/v1): the API refuses with 429 while a PodDisruptionBudget forbids it."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/eviction", body,
                            query={"dryRun": "All"} if dry_run else None)


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def in_cluster() -> Client | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = SA_DIR / "token"
    if not host or not token.exists():
        return None
    host = f"[{host}]" if ":" in host else host
    ca = SA_DIR / "ca.crt"
    return Client(f"https://{host}:{port}", token_file=token, ca_file=str(ca) if ca.exists() else None)


def _data_file(data: str, suffix: str) -> str:
    """ssl wants files: inline kubeconfig data (base64) in a 0600 temp file, removed when the process exits."""
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as e:
        raise UsageError(f"kubeconfig: invalid base64 in a *-data field ({e})") from e
    return private_file(raw, "vgpu-patch-kube-", suffix)


def from_kubeconfig(path: Path | str | None = None, context: str | None = None) -> Client:
    import yaml  # lazily: the agent image carries no PyYAML and never reads a kubeconfig

    files = [Path(path)] if path else [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or \
        [Path.home() / ".kube" / "config"]
    cfg: dict = {}
    user_dirs: dict[str, Path] = {}  # a user's exec command may be relative to the file that names it
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text()) or {}
        except FileNotFoundError:
            continue
        except (OSError, yaml.YAMLError) as e:
            raise UsageError(f"{f}: unreadable kubeconfig ({e})") from e
        if not isinstance(doc, dict):
            raise UsageError(f"{f}: not a kubeconfig (expected a mapping at the top)")
        for section in ("clusters", "users", "contexts"):
            cfg.setdefault(section, []).extend(doc.get(section) or [])
        for item in doc.get("users") or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                user_dirs.setdefault(item["name"], f.resolve().parent)
        cfg.setdefault("current-context", doc.get("current-context"))
    if not cfg:
        raise UsageError(f"no kubeconfig found ({', '.join(map(str, files))}); give --kubeconfig or --api-server")
    name = context or cfg.get("current-context")

    def pick(kind: str, n: str | None) -> dict:
        for item in cfg.get(kind) or []:
            if item.get("name") == n:
                return dict(item.get(kind[:-1]) or {})
        raise UsageError(f"kubeconfig has no {kind[:-1]} {n!r}; pick one with --context")

    ctx = pick("contexts", name)
    cluster, user = pick("clusters", ctx.get("cluster")), pick("users", ctx.get("user"))
    if "auth-provider" in user:
        provider = (user.get("auth-provider") or {}).get("name") or "?"
        raise UsageError(f"kubeconfig user {ctx.get('user')!r} uses the legacy auth-provider {provider!r} (gone from "
                         "kubectl since 1.26); switch it to its exec plugin (gke-gcloud-auth-plugin, kubelogin), "
                         "or start `kubectl proxy` and pass --api-server http://127.0.0.1:8001")
    plugin = None
    if user.get("exec"):
        plugin = ExecPlugin.from_kubeconfig(str(ctx.get("user")), user["exec"], cluster,
                                            user_dirs.get(str(ctx.get("user")), Path.cwd()))
    ca: str | None = cluster.get("certificate-authority")
    if cluster.get("certificate-authority-data"):
        ca = _data_file(cluster["certificate-authority-data"], ".crt")
    cert: str | None = user.get("client-certificate")
    key: str | None = user.get("client-key")
    if user.get("client-certificate-data"):
        cert = _data_file(user["client-certificate-data"], ".crt")
    if user.get("client-key-data"):
        key = _data_file(user["client-key-data"], ".key")
    token_file = Path(user["tokenFile"]) if user.get("tokenFile") else None
    return Client(str(cluster.get("server") or ""), token=user.get("token"), token_file=token_file, ca_file=ca,
                  cert_file=cert, key_file=key, insecure=bool(cluster.get("insecure-skip-tls-verify")),
                  exec_plugin=plugin)


def connect(server: str | None = None, *, token_file: Path | None = None, kubeconfig: Path | None = None,
            context: str | None = None, insecure: bool = False) -> Client:
    """The client for the first configuration that applies (see the module docstring)."""
    if server:
        return Client(server, token_file=token_file, insecure=insecure)
    if kubeconfig is None:
        c = in_cluster()
        if c is not None:
            return c
    return from_kubeconfig(kubeconfig, context)
