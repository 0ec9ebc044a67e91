"""A tiny fake Kubernetes API server on 127.0.0.1 (http.server) that records every request.

It serves the few calls vgpu-patch makes: nodes (get, list, merge-patch of annotations), pods (list by
fieldSelector spec.nodeName, get) and the policy/v1 Eviction subresource, which answers 429 for pods listed
in `pdb_blocked` the way the API server does while a PodDisruptionBudget allows no disruption.
Faults: `fail[(method, path)]` is a list of status codes answered (one per request) before the real answer;
`slow[(method, path)]` delays the answer of a request that was applied (a client timing out on it).
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class FakeKube:
    nodes: dict[str, dict] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict] = field(default_factory=dict)  # (namespace, name) -> pod
    pdb_blocked: set[tuple[str, str]] = field(default_factory=set)
    token: str | None = None  # when set, requests must carry it
    requests: list[Request] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    fail: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    slow: dict[tuple[str, str], float] = field(default_factory=dict)
    url: str = ""

    def add_node(self, name: str, annotations: dict[str, str] | None = None) -> None:
        self.nodes[name] = {"metadata": {"name": name, "annotations": dict(annotations or {})}}

    def add_pod(self, namespace: str, name: str, uid: str, node: str, owner: str | None = "ReplicaSet",
                annotations: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": uid, "annotations": annotations or {}}
        if owner:
            meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True, "uid": "o-1"}]
        self.pods[(namespace, name)] = {"metadata": meta, "spec": {"nodeName": node}}

    def calls(self, method: str | None = None) -> list[Request]:
        return [r for r in self.requests if method is None or r.method == method]

    # -- the server -----------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] != ["api", "v1"]:
            return 404, _status(404, "NotFound", f"no route {path}")
        rest = parts[2:]
        if rest == ["nodes"] and method == "GET":
            return 200, {"kind": "NodeList", "items": list(self.nodes.values())}
        if len(rest) == 2 and rest[0] == "nodes":
            node = self.nodes.get(rest[1])
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{rest[1]}" not found')
            if method == "PATCH":
                ann = node["metadata"].setdefault("annotations", {})
                for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items():
                    if v is None:
                        ann.pop(k, None)
                    else:
                        ann[k] = v
            return 200, node
        if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "events" and method == "POST":
            self.events.append(body)
            return 201, body
        if rest == ["pods"] and method == "GET":
            sel = query.get("fieldSelector", "")
            node = sel.split("=", 1)[1] if sel.startswith("spec.nodeName=") else None
            items = [p for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
            return 200, {"kind": "PodList", "items": items}
        if len(rest) >= 4 and rest[0] == "namespaces" and rest[2] == "pods":
            key = (rest[1], rest[3])
            pod = self.pods.get(key)
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{rest[3]}" not found')
            if len(rest) == 5 and rest[4] == "eviction" and method == "POST":
                want_uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
                if want_uid and want_uid != pod["metadata"]["uid"]:
                    return 409, _status(409, "Conflict", "Precondition failed: UID in precondition")
                if key in self.pdb_blocked:
                    return 429, _status(429, "TooManyRequests",
                                        "Cannot evict pod as it would violate the pod's disruption budget.")
                if query.get("dryRun") != "All":
                    del self.pods[key]
                return 201, _status(201, "", "")
            if len(rest) == 4 and method == "GET":
                return 200, pod
        return 404, _status(404, "NotFound", f"no route {method} {path}")

    def __enter__(self) -> FakeKube:
        kube = self

        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                u = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(u.query))
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                kube.requests.append(Request(self.command, u.path, query, body, dict(self.headers)))
                faults = kube.fail.get((self.command, u.path))
                if kube.token and self.headers.get("Authorization") != f"Bearer {kube.token}":
                    code, doc = 401, _status(401, "Unauthorized", "Unauthorized")
                elif faults:
                    code = faults.pop(0)
                    doc = _status(code, "Injected", f"injected HTTP {code}")
                else:
                    code, doc = kube.handle(self.command, u.path, query, body or {})
                    time.sleep(kube.slow.get((self.command, u.path), 0.0))
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that timed out
                    self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _do

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else "Success",
            "reason": reason, "message": message, "code": code}
