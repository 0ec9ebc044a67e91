"""Render the node agent's DaemonSet manifest (`vgpu-patch daemonset`); deploy/daemonset.yaml is its output.

The pod sees only the library directory of the host (hostPath, mounted under --host-root), runs as
root without privilege and with one capability (CHOWN, so a swap keeps the live file's owner: without
it the agent still works but the new file is owned by root), and has a read-only root filesystem;
the swap's upload area (/host/tmp) and the status file live on emptyDirs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import __version__
from .errors import UsageError

IMAGE_LIB_DIR = "/opt/vgpu-patch"
HOST_ROOT = "/host"
STATUS_DIR = "/run/vgpu-patch"
APP = "vgpu-patch-agent"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"  # DNS prefix/
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class DaemonSetOptions:
    image: str = f"vgpu-patch-agent:{__version__}"
    namespace: str = "kube-system"
    name: str = APP
    node_selector: dict[str, str] = field(default_factory=lambda: {"gpu": "on"})
    host_dir: str = "/usr/local/vgpu"
    sha256: str | None = None
    interval: float = 10.0
    metrics_port: int | None = 9400
    max_unavailable: str = "1"
    cpu_request: str = "10m"
    memory_request: str = "32Mi"
    cpu_limit: str = "200m"
    memory_limit: str = "128Mi"
    priority_class: str | None = "system-node-critical"
    tolerate_gpu_taint: bool = True


def parse_node_selector(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`k=v` strings (label key and value syntax checked) -> dict."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise UsageError(f"--node-selector {item!r}: expected a label KEY=VALUE such as gpu=on or "
                             "nvidia.com/gpu.present=true")
        out[key] = value
    return out


def _check(opts: DaemonSetOptions) -> None:
    for what, value in (("--namespace", opts.namespace), ("--name", opts.name)):
        if not _DNS_LABEL.match(value):
            raise UsageError(f"{what} {value!r}: must be a DNS label (lower-case letters, digits, '-')")
    if not opts.host_dir.startswith("/") or opts.host_dir.rstrip("/") in ("", "/usr", "/usr/local", "/etc"):
        raise UsageError(f"--host-dir {opts.host_dir!r}: give the library directory itself, e.g. /usr/local/vgpu")
    if not re.match(r"^\d+%?$", opts.max_unavailable):
        raise UsageError(f"--max-unavailable {opts.max_unavailable!r}: a count (1) or a percentage (10%)")


def agent_args(opts: DaemonSetOptions, *, probe: bool = False) -> list[str]:
    host_dir = opts.host_dir.rstrip("/")
    args = ["--library", f"{IMAGE_LIB_DIR}/libvgpu.so", "--host-root", HOST_ROOT, "--target-dir", host_dir]
    if opts.sha256:
        args += ["--sha256", opts.sha256]
    if probe:
        return ["vgpu-patch", "agent", "--probe", *args]
    args += ["--interval", f"{opts.interval:g}", "--status-file", f"{STATUS_DIR}/agent.json"]
    if opts.metrics_port is not None:
        args += ["--metrics-port", str(opts.metrics_port)]
    return args


def render(opts: DaemonSetOptions) -> dict[str, Any]:
    """The DaemonSet as a dict (apps/v1)."""
    _check(opts)
    host_dir = opts.host_dir.rstrip("/")
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "vgpu-patch"}
    pod_labels = {**labels, "app.kubernetes.io/version": __version__}
    container: dict[str, Any] = {
        "name": "agent",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vgpu-patch", "agent"],
        "args": agent_args(opts),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "readinessProbe": {
            "exec": {"command": agent_args(opts, probe=True)},
            "initialDelaySeconds": 2,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "resources": {
            "requests": {"cpu": opts.cpu_request, "memory": opts.memory_request},
            "limits": {"cpu": opts.cpu_limit, "memory": opts.memory_limit},
        },
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "host-lib", "mountPath": f"{HOST_ROOT}{host_dir}"},
            {"name": "upload", "mountPath": f"{HOST_ROOT}/tmp"},
            {"name": "status", "mountPath": STATUS_DIR},
        ],
    }
    annotations: dict[str, str] = {}
    if opts.metrics_port is not None:
        container["ports"] = [{"name": "metrics", "containerPort": opts.metrics_port, "protocol": "TCP"}]
        container["livenessProbe"] = {
            "httpGet": {"path": "/metrics", "port": "metrics"},
            "initialDelaySeconds": 10,
            "periodSeconds": 30,
            "timeoutSeconds": 5,
        }
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(opts.metrics_port),
                       "prometheus.io/path": "/metrics"}
    pod_spec: dict[str, Any] = {
        "nodeSelector": dict(opts.node_selector),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 15,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "host-lib", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}},
            {"name": "upload", "emptyDir": {"sizeLimit": "256Mi"}},
            {"name": "status", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    if opts.priority_class:
        pod_spec["priorityClassName"] = opts.priority_class
    if opts.tolerate_gpu_taint:
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if annotations:
        template_meta["annotations"] = annotations
    max_unavailable: int | str = int(opts.max_unavailable) if opts.max_unavailable.isdigit() else opts.max_unavailable
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": dict(labels)},  # a copy: no YAML anchors in the output
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
            "minReadySeconds": 10,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


HEADER = """\
# The vgpu-patch node agent: installs the image's libvgpu.so into the host's {host_dir} with the
# same protocol as `vgpu-patch deploy`, and puts it back when HAMi's device plugin copies its own file over it.
# Rendered by `vgpu-patch daemonset` (vgpu-patch {version}); re-render rather than edit. See docs/fleet.md.
"""


def render_yaml(opts: DaemonSetOptions) -> str:
    doc = render(opts)
    return HEADER.format(host_dir=opts.host_dir.rstrip("/"), version=__version__) + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=False, width=120
    )
