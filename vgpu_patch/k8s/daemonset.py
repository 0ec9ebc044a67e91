"""Render the node agent's manifests (`vgpu-patch daemonset`); deploy/daemonset.yaml is its default output.

The Helm chart in charts/vgpu-patch-agent/ reads the same option set: its values.yaml and
values.schema.json are generated from `DaemonSetOptions` (`chart_values()`, `values_schema()`), and a test
renders the chart with each value set and compares it with `render_all()` of the matching options.

The pod sees the host's library directory (hostPath, mounted under --host-root) and, with hostPID, the
host's processes (to name the pods still mapping an old library; CAP_SYS_PTRACE lets it read the maps of
processes of other users). It runs as root without privilege, capabilities dropped but CHOWN (so a swap
keeps the live file's owner), with a read-only root filesystem; the swap's upload area (/host/tmp) and the
status file live on emptyDirs. Probes never start a Python interpreter: httpGet on the agent's port, or
without a port `test -e` of the ready marker and a shell check of the status file's age.
"""
from __future__ import annotations

import json
import posixpath
import re
import textwrap
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .. import __version__
from ..report.errors import UsageError

IMAGE_LIB_DIR = "/opt/vgpu-patch"
HOST_ROOT = "/host"
STATUS_DIR = "/run/vgpu-patch"
STATUS_FILE = f"{STATUS_DIR}/agent.json"
READY_FILE = f"{STATUS_DIR}/ready"
SIGNERS_DIR = "/etc/vgpu-patch"  # the allowed-signers ConfigMap, mounted read-only
SIGNERS_FILE = f"{SIGNERS_DIR}/allowed_signers"
APP = "vgpu-patch-agent"
SYSTEM_NAMESPACE = "kube-system"  # the only namespace admitting system-* priority classes by default
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# --host-dir / hostDir: one rule for the CLI and the chart's schema (which cannot normalise a path, so both take
# only a normal one): a directory strictly under one of these roots, each part a name (not `.` or `..`), no `//`,
# no control character. Go's regexp (helm) has no lookahead: a part is spelled out as "not . and not ..".
HOST_DIR_ROOTS = ("/usr/local", "/opt", "/var/lib")
_PART = r"(?:[^/.\x00-\x1f][^/\x00-\x1f]*|\.[^/.\x00-\x1f][^/\x00-\x1f]*|\.\.[^/\x00-\x1f]+)"
HOST_DIR_PATTERN = (rf"^(?:{'|'.join(re.escape(r) for r in HOST_DIR_ROOTS)})(?:/{_PART})+/?$")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
DEFAULT_NODE_SELECTOR = {"gpu": "on"}  # HAMi's GPU node label
# Kubernetes quantities (resource.Quantity): a non-negative decimal with a binary (Ki..Ei) or decimal (n..E)
# suffix or an exponent; the schema carries the same pattern, so the chart refuses what the CLI refuses
QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
# image references as the container runtimes parse them (distribution/reference), split the way HAMi's chart is
_REGISTRY = r"^(localhost|[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)+)(:[0-9]+)?$"
_REPOSITORY = r"^[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$"
_TAG = r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|sha256:[0-9a-f]{64})$"  # a tag, or a digest (rendered with @)
PULL_POLICIES = ("IfNotPresent", "Always", "Never")


@dataclass
class ImageRef:
    """The agent image as HAMi's chart spells images: `{registry, repository, tag, pullPolicy}`.

    An empty registry is the runtime's default (docker.io); an empty tag is this version of vgpu-patch
    (the chart's appVersion); a tag `sha256:<hex>` is a digest and renders as `repository@sha256:<hex>`.
    """

    registry: str = ""
    repository: str = APP
    tag: str = ""
    pull_policy: str = "IfNotPresent"

    @classmethod
    def parse(cls, ref: str, pull_policy: str = "IfNotPresent") -> ImageRef:
        """`[REGISTRY/]REPOSITORY[:TAG|@sha256:DIGEST]`, split as the runtimes do; a bad one is a UsageError."""
        rest, at, digest = ref.partition("@")
        registry = ""
        first, slash, after = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, rest = first, after
        repo, tag = rest, ""
        if ":" in rest.rsplit("/", 1)[-1]:
            repo, tag = rest.rsplit(":", 1)
        if at:
            tag = digest
        img = cls(registry, repo, tag, pull_policy)
        img.check(f"--image {ref!r}")
        return img

    def check(self, what: str) -> None:
        parts = (("registry", self.registry, _REGISTRY), ("repository", self.repository, _REPOSITORY),
                 ("tag", self.tag, _TAG))
        for part, value, pattern in parts:
            if (value and not re.fullmatch(pattern, value)) or (part == "repository" and not value):
                raise UsageError(f"{what}: bad {part} {value!r}; expected [REGISTRY[:PORT]/]REPOSITORY[:TAG] "
                                 "with a lower-case repository, e.g. registry.example.com/vgpu-patch-agent:0.1.0")
        if self.pull_policy not in PULL_POLICIES:
            raise UsageError(f"{what}: pull policy {self.pull_policy!r}: one of {', '.join(PULL_POLICIES)}")

    def reference(self) -> str:
        tag = self.tag or __version__
        name = f"{self.registry}/{self.repository}" if self.registry else self.repository
        return f"{name}@{tag}" if tag.startswith("sha256:") else f"{name}:{tag}"

    def values(self) -> dict[str, str]:
        return {"registry": self.registry, "repository": self.repository, "tag": self.tag,
                "pullPolicy": self.pull_policy}


@dataclass
class AllowedSigners:
    """The allowed-signers file the agent checks the image's library against (docs/signing.md): a key of a
    ConfigMap in the agent's namespace, mounted read-only. No ConfigMap: the agent checks no signature."""

    config_map: str | None = None
    key: str = "allowed_signers"

    def check(self) -> None:
        if self.config_map is not None and not _DNS_SUBDOMAIN.fullmatch(self.config_map):
            raise UsageError(f"--allowed-signers-configmap {self.config_map!r}: not a valid ConfigMap name")
        if not _CONFIGMAP_KEY.fullmatch(self.key) or self.key in (".", ".."):
            raise UsageError(f"--allowed-signers-key {self.key!r}: not a valid ConfigMap key (letters, digits, "
                             "'-', '_', '.')")

    def values(self) -> dict[str, str | None]:
        return {"configMap": self.config_map, "key": self.key}


@dataclass
class DaemonSetOptions:
    """Every knob of the manifests; the chart's values carry the same names (camelCase there, see VALUE_NAMES)."""

    image: ImageRef = field(default_factory=ImageRef)
    namespace: str = SYSTEM_NAMESPACE
    name: str = APP
    node_selector: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NODE_SELECTOR))
    host_dir: str = "/usr/local/vgpu"
    sha256: str | None = None
    interval: float = 10.0
    metrics_port: int | None = 9400
    max_unavailable: str = "1"
    cpu_request: str = "10m"
    memory_request: str = "32Mi"
    cpu_limit: str = "200m"
    memory_limit: str = "128Mi"
    priority_class: str | None = "auto"  # auto: system-node-critical in kube-system, none elsewhere
    tolerate_gpu_taint: bool = True
    tolerations: list[dict[str, str]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    selinux: dict[str, str] = field(default_factory=dict)  # seLinuxOptions: user, role, type, level
    host_pid: bool = True  # see the host's processes: which pods still map an old library
    rbac: bool = False  # ServiceAccount + ClusterRole: annotate the node, name the stale pods
    allowed_signers: AllowedSigners = field(default_factory=AllowedSigners)


# option name -> chart value name (values.yaml); one table, used by the generator and the chart test
VALUE_NAMES = {
    "image": "image", "name": "fullnameOverride", "node_selector": "nodeSelector", "host_dir": "hostDir",
    "sha256": "sha256", "interval": "interval", "metrics_port": "metricsPort", "max_unavailable": "maxUnavailable",
    "cpu_request": "cpuRequest", "memory_request": "memoryRequest", "cpu_limit": "cpuLimit",
    "memory_limit": "memoryLimit", "priority_class": "priorityClassName", "tolerate_gpu_taint": "tolerateGpuTaint",
    "tolerations": "tolerations", "image_pull_secrets": "imagePullSecrets", "selinux": "seLinuxOptions",
    "host_pid": "hostPID", "rbac": "rbac", "allowed_signers": "allowedSigners",
}  # namespace: the release's namespace (helm install -n)

# one line per value in the generated values.yaml: the option it mirrors and what it does
VALUE_HELP = {
    "image": "--image REF, --image-pull-policy: the agent image, split as HAMi's chart does (empty registry: the "
             "runtime's default; empty tag: the chart's appVersion; tag sha256:<hex>: a digest). Build and push it "
             "first (one tag for amd64 and arm64): deploy/build-multiarch.sh REGISTRY/vgpu-patch-agent:TAG --push",
    "fullnameOverride": "--name: name of the DaemonSet, ServiceAccount and ClusterRole",
    "nodeSelector": "--node-selector KEY=VALUE: node labels to run on; null = gpu=on (HAMi's GPU label); a map "
                    "replaces it, {} = all nodes",
    "hostDir": "--host-dir: the host's library directory, under /usr/local, /opt or /var/lib (no '.' or '..' parts)",
    "sha256": "--sha256: pin the library's sha256 (null: the image's build manifest)",
    "interval": "--interval: seconds between re-checks (inotify wakes the agent sooner)",
    "metricsPort": "--metrics-port: /metrics, /readyz, /livez; null: no port, exec probes on files",
    "maxUnavailable": "--max-unavailable: rolling update, nodes at once (N or N%)",
    "cpuRequest": "container CPU request",
    "memoryRequest": "container memory request",
    "cpuLimit": "--cpu-limit: container CPU limit",
    "memoryLimit": "--memory-limit: container memory limit",
    "priorityClassName": "--priority-class: auto = system-node-critical in kube-system only; null or '' = none",
    "tolerateGpuTaint": "tolerate the nvidia.com/gpu NoSchedule taint",
    "tolerations": "--toleration: more tolerations (Kubernetes toleration objects)",
    "imagePullSecrets": "--image-pull-secret: names of Secrets for a private registry",
    "seLinuxOptions": "--selinux: container seLinuxOptions (user, role, type, level), e.g. {type: spc_t}",
    "hostPID": "--host-pid: see the host's processes (with SYS_PTRACE) to name pods still on an old library",
    "rbac": "--rbac: ServiceAccount + ClusterRole so the agent annotates its node (vgpu-patch restart-plan)",
    "allowedSigners": "--allowed-signers-configmap NAME, --allowed-signers-key KEY: a ConfigMap (in the release's "
                      "namespace) whose KEY is an OpenSSH allowed-signers file; the agent then installs the image's "
                      "library only with a valid libvgpu.so.sig by one of its keys (docs/signing.md); null: no check",
}


def parse_node_selector(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`k=v` strings (label key and value syntax checked) -> dict."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise UsageError(f"--node-selector {item!r}: expected a label KEY=VALUE such as gpu=on or "
                             "nvidia.com/gpu.present=true")
        out[key] = value
    return out


def parse_toleration(spec: str) -> dict[str, str]:
    """`KEY[=VALUE][:EFFECT]`, or `*` (tolerate every taint) -> a toleration."""
    if spec == "*":
        return {"operator": "Exists"}
    body, _, effect = spec.partition(":")
    key, eq, value = body.partition("=")
    bad_value = eq and not _LABEL_VALUE.fullmatch(value)
    if not _LABEL_KEY.fullmatch(key) or bad_value or (effect and effect not in _EFFECTS):
        raise UsageError(f"--toleration {spec!r}: expected KEY[=VALUE][:EFFECT] "
                         f"(effect one of {', '.join(_EFFECTS)}) or '*'")
    t = {"key": key, "operator": "Equal", "value": value} if eq else {"key": key, "operator": "Exists"}
    if effect:
        t["effect"] = effect
    return t


def parse_selinux(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`type=spc_t`, `level=s0:c123,c456`, `user=...`, `role=...` -> seLinuxOptions."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ("user", "role", "type", "level") or not value or any(c.isspace() for c in value):
            raise UsageError(f"--selinux {item!r}: expected user=, role=, type= or level= with a value, "
                             "e.g. type=spc_t")
        out[key] = value
    return out


def priority_class(opts: DaemonSetOptions) -> str | None:
    if opts.priority_class == "auto":
        return "system-node-critical" if opts.namespace == SYSTEM_NAMESPACE else None
    return opts.priority_class or None


def _check(opts: DaemonSetOptions) -> None:
    opts.image.check("--image")
    opts.allowed_signers.check()
    for what, value in (("--cpu-limit", opts.cpu_limit), ("--memory-limit", opts.memory_limit),
                        ("cpu request", opts.cpu_request), ("memory request", opts.memory_request)):
        if not re.fullmatch(QUANTITY, value):
            raise UsageError(f"{what} {value!r}: not a Kubernetes quantity; e.g. 200m or 0.5 (CPU), "
                             "128Mi or 1Gi (memory)")
    for what, value in (("--namespace", opts.namespace), ("--name", opts.name)):
        if not _DNS_LABEL.fullmatch(value):
            raise UsageError(f"{what} {value!r}: must be a DNS label (lower-case letters, digits, '-')")
    check_host_dir(opts.host_dir)
    if not re.fullmatch(r"^\d+%?$", opts.max_unavailable):
        raise UsageError(f"--max-unavailable {opts.max_unavailable!r}: a count (1) or a percentage (10%)")
    pc = priority_class(opts)
    if pc and pc.startswith("system-") and opts.namespace != SYSTEM_NAMESPACE:
        raise UsageError(f"--priority-class {pc}: Kubernetes admits system-* priority classes only in kube-system by "
                         f"default; use --priority-class auto, '' or your own class for namespace {opts.namespace}")
    if pc and not _DNS_SUBDOMAIN.fullmatch(pc):
        raise UsageError(f"--priority-class {pc!r}: not a valid PriorityClass name")
    for s in opts.image_pull_secrets:
        if not _DNS_SUBDOMAIN.fullmatch(s):
            raise UsageError(f"--image-pull-secret {s!r}: not a valid Secret name")


def check_host_dir(value: str) -> None:
    """UsageError unless `value`, normalised, is a directory under HOST_DIR_ROOTS and is spelled normalised (the
    chart's schema applies the same HOST_DIR_PATTERN, and cannot normalise)."""
    roots = ", ".join(HOST_DIR_ROOTS[:-1]) + f" or {HOST_DIR_ROOTS[-1]}"
    norm = posixpath.normpath(value) if value.startswith("/") and value.isprintable() else ""
    if not norm or not any(norm.startswith(r + "/") for r in HOST_DIR_ROOTS) or norm.startswith("//"):
        raise UsageError(f"--host-dir {value!r}: not a directory under {roots}: give the library directory itself, "
                         "e.g. /usr/local/vgpu")
    if not re.fullmatch(HOST_DIR_PATTERN, value):
        raise UsageError(f"--host-dir {value!r}: give it as {norm} (no '.', '..' or '//' parts: the chart's "
                         "hostDir takes the same spelling)")


def agent_args(opts: DaemonSetOptions, *, probe: bool = False) -> list[str]:
    host_dir = opts.host_dir.rstrip("/")
    args = ["--library", f"{IMAGE_LIB_DIR}/libvgpu.so", "--host-root", HOST_ROOT, "--target-dir", host_dir]
    if opts.sha256:
        args += ["--sha256", opts.sha256]
    if opts.allowed_signers.config_map:
        args += ["--allowed-signers", SIGNERS_FILE]
    if probe:
        return ["vgpu-patch", "agent", "--probe", *args]
    args += ["--interval", f"{opts.interval:g}", "--status-file", STATUS_FILE]
    if opts.metrics_port is not None:
        args += ["--metrics-port", str(opts.metrics_port)]
    if not opts.host_pid:
        args += ["--no-stale-scan"]
    args += ["--report", "on" if opts.rbac else "off"]
    return args


def stuck_after(opts: DaemonSetOptions) -> int:
    """Seconds without a loop turn before liveness fails; the agent computes the same default."""
    return int(max(120.0, 3 * opts.interval + 60.0))


def _probes(opts: DaemonSetOptions) -> dict[str, Any]:
    if opts.metrics_port is not None:
        return {
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "initialDelaySeconds": 2,
                               "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3},
            "livenessProbe": {"httpGet": {"path": "/livez", "port": "metrics"}, "initialDelaySeconds": 10,
                              "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3},
        }
    age = f'test $(( $(date +%s) - $(stat -c %Y {STATUS_FILE}) )) -lt {stuck_after(opts)}'
    return {
        "readinessProbe": {"exec": {"command": ["test", "-e", READY_FILE]}, "initialDelaySeconds": 2,
                           "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {"exec": {"command": ["sh", "-c", age]}, "initialDelaySeconds": 30, "periodSeconds": 30,
                          "timeoutSeconds": 5, "failureThreshold": 3},
    }


def labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "vgpu-patch"}


def render(opts: DaemonSetOptions) -> dict[str, Any]:
    """The DaemonSet as a dict (apps/v1)."""
    _check(opts)
    host_dir = opts.host_dir.rstrip("/")
    pod_labels = {**labels(), "app.kubernetes.io/version": __version__}
    caps = ["CHOWN", "SYS_PTRACE"] if opts.host_pid else ["CHOWN"]
    security: dict[str, Any] = {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": caps},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if opts.selinux:
        security["seLinuxOptions"] = dict(opts.selinux)
    container: dict[str, Any] = {
        "name": "agent",
        "image": opts.image.reference(),
        "imagePullPolicy": opts.image.pull_policy,
        "command": ["vgpu-patch", "agent"],
        "args": agent_args(opts),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        **_probes(opts),
        "resources": {
            "requests": {"cpu": opts.cpu_request, "memory": opts.memory_request},
            "limits": {"cpu": opts.cpu_limit, "memory": opts.memory_limit},
        },
        "securityContext": security,
        "volumeMounts": [
            {"name": "host-lib", "mountPath": f"{HOST_ROOT}{host_dir}"},
            {"name": "upload", "mountPath": f"{HOST_ROOT}/tmp"},
            {"name": "status", "mountPath": STATUS_DIR},
        ],
    }
    annotations: dict[str, str] = {}
    if opts.metrics_port is not None:
        container["ports"] = [{"name": "metrics", "containerPort": opts.metrics_port, "protocol": "TCP"}]
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(opts.metrics_port),
                       "prometheus.io/path": "/metrics"}
    pod_spec: dict[str, Any] = {
        "nodeSelector": dict(opts.node_selector),
        "hostPID": opts.host_pid,
        "automountServiceAccountToken": opts.rbac,
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
    if opts.allowed_signers.config_map:
        signers = opts.allowed_signers
        container["volumeMounts"].append({"name": "allowed-signers", "mountPath": SIGNERS_DIR, "readOnly": True})
        pod_spec["volumes"].append({"name": "allowed-signers", "configMap": {
            "name": signers.config_map, "items": [{"key": signers.key, "path": SIGNERS_FILE.rsplit("/", 1)[1]}]}})
    if opts.rbac:
        pod_spec["serviceAccountName"] = opts.name
    if opts.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    pc = priority_class(opts)
    if pc:
        pod_spec["priorityClassName"] = pc
    tolerations = ([dict(GPU_TOLERATION)] if opts.tolerate_gpu_taint else []) + [dict(t) for t in opts.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if annotations:
        template_meta["annotations"] = annotations
    max_unavailable: int | str = int(opts.max_unavailable) if opts.max_unavailable.isdigit() else opts.max_unavailable
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": labels()},
        "spec": {
            "selector": {"matchLabels": labels()},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
            "minReadySeconds": 10,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def render_rbac(opts: DaemonSetOptions) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole (nodes patch, pods list, events create) and its binding; empty without --rbac."""
    if not opts.rbac:
        return []
    meta = {"name": opts.name, "labels": labels()}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": opts.namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": dict(meta),
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": opts.name},
         "subjects": [{"kind": "ServiceAccount", "name": opts.name, "namespace": opts.namespace}]},
    ]


def render_all(opts: DaemonSetOptions) -> list[dict[str, Any]]:
    """Every document, in apply order: RBAC first (when asked for), then the DaemonSet."""
    ds = render(opts)
    return [*render_rbac(opts), ds]


HEADER = """\
# The vgpu-patch node agent: installs the image's libvgpu.so into the host's {host_dir} with the
# same protocol as `vgpu-patch deploy`, and puts it back when HAMi's device plugin copies its own file over it.
# Rendered by `vgpu-patch daemonset` (vgpu-patch {version}); re-render rather than edit. See docs/fleet.md.
"""


def render_yaml(opts: DaemonSetOptions) -> str:
    import yaml

    docs = render_all(opts)
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=120) for d in docs)
    return HEADER.format(host_dir=opts.host_dir.rstrip("/"), version=__version__) + body


# -- the chart's values, generated from the same options -------------------------------------------------
def chart_values(opts: DaemonSetOptions | None = None) -> dict[str, Any]:
    """values.yaml of charts/vgpu-patch-agent: the options under their chart names.

    The default node selector is null there, and the template reads null as gpu=on: helm merges a map the
    user gives into the chart's map of the same name, so a default `nodeSelector: {gpu: "on"}` would stay
    in every selector (AND-ed with the user's labels) and `{}` could never clear it. Over null, the user's
    map replaces the default, as --node-selector does.
    """
    opts = opts or DaemonSetOptions()
    d = asdict(opts)
    values = {VALUE_NAMES[k]: d[k] for k in VALUE_NAMES}
    values["image"] = opts.image.values()
    values["allowedSigners"] = opts.allowed_signers.values()
    if values["nodeSelector"] == DEFAULT_NODE_SELECTOR:
        values["nodeSelector"] = None
    return values


_SCHEMA_TYPES = {"str": "string", "float": "number", "int": "integer", "bool": "boolean"}


def values_schema() -> dict[str, Any]:
    """values.schema.json: helm refuses values of the wrong type before rendering anything."""
    props: dict[str, Any] = {}
    for f in fields(DaemonSetOptions):
        if f.name not in VALUE_NAMES:
            continue
        t = str(f.type)
        if t in ("ImageRef", "AllowedSigners"):
            continue  # objects of their own, below
        if t.startswith("dict"):
            schema: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
        elif t.startswith("list[dict"):
            schema = {"type": "array", "items": {"type": "object"}}
        elif t.startswith("list"):
            schema = {"type": "array", "items": {"type": "string"}}
        else:
            base = t.split("|")[0].strip()
            schema = {"type": [_SCHEMA_TYPES[base], "null"] if "None" in t else _SCHEMA_TYPES[base]}
        props[VALUE_NAMES[f.name]] = schema
    props["image"] = {"type": "object", "additionalProperties": False, "required": ["repository"], "properties": {
        "registry": {"type": "string", "pattern": f"^$|{_REGISTRY}"},
        "repository": {"type": "string", "pattern": _REPOSITORY},
        "tag": {"type": "string", "pattern": f"^$|{_TAG}"},
        "pullPolicy": {"enum": list(PULL_POLICIES)}}}
    props["allowedSigners"] = {"type": "object", "additionalProperties": False, "properties": {
        "configMap": {"type": ["string", "null"], "pattern": _DNS_SUBDOMAIN.pattern},
        "key": {"type": "string", "pattern": _CONFIGMAP_KEY.pattern}}}
    # names pasted into the pod spec: a pattern (no newline, no YAML) besides the templates' quoting
    props["fullnameOverride"] = {"type": "string", "pattern": _DNS_LABEL.pattern}
    props["priorityClassName"] = {"type": ["string", "null"], "pattern": f"^(auto|{_DNS_SUBDOMAIN.pattern[1:-1]})?$"}
    props["sha256"] = {"type": ["string", "null"], "pattern": "^[0-9a-fA-F]{64}$"}
    props["hostDir"] = {"type": "string", "pattern": HOST_DIR_PATTERN}  # check_host_dir's rule
    props["nodeSelector"] = {"type": ["object", "null"], "additionalProperties": {"type": "string"}}  # null: gpu=on
    props["interval"] = {"type": "number", "minimum": 0.5}
    props["metricsPort"] = {"type": ["integer", "null"], "minimum": 1, "maximum": 65535}  # null: no port, exec probes
    props["global"] = {"type": "object"}  # helm passes `global` to a chart used as a dependency
    # `helm --set maxUnavailable=2` or `--set cpuLimit=1` gives numbers: both spellings are fine there
    props["maxUnavailable"] = {"type": ["string", "integer"], "pattern": r"^\d+%?$"}
    for key in ("cpuRequest", "memoryRequest", "cpuLimit", "memoryLimit"):  # a pattern applies to strings only
        props[key] = {"type": ["string", "number"], "minimum": 0, "pattern": QUANTITY}
    return {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
            "properties": props}


def chart_files() -> dict[str, str]:
    """The generated files of the chart (relative path -> text); the templates themselves are hand-written."""
    import yaml

    head = "# Generated from vgpu_patch/k8s/daemonset.py (DaemonSetOptions) by `vgpu-patch daemonset --write-chart`.\n"
    values = head + "# Each key is an option of `vgpu-patch daemonset`; the namespace is the release's (helm -n).\n"
    for key, value in chart_values().items():
        values += "\n" + "".join(f"# {line}\n" for line in textwrap.wrap(VALUE_HELP[key], 116))
        values += yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False, width=120)
    chart = head + yaml.safe_dump({
        "apiVersion": "v2", "name": APP,
        "description": "The vgpu-patch node agent: keeps a fixed libvgpu.so on GPU nodes",
        "type": "application", "version": __version__, "appVersion": __version__,
        "kubeVersion": ">=1.25.0-0",
    }, sort_keys=False)
    schema = json.dumps(values_schema(), indent=2) + "\n"
    return {"Chart.yaml": chart, "values.yaml": values, "values.schema.json": schema}
