"""`vgpu-patch daemonset`, deploy/daemonset.yaml and deploy/Dockerfile, validated offline."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from agent_helpers import Host, Image
from click.testing import CliRunner

from vgpu_patch.agent.image import default_manifest
from vgpu_patch.commands.daemonset import cli
from vgpu_patch.k8s.daemonset import HOST_ROOT, IMAGE_LIB_DIR, DaemonSetOptions, render_yaml

REPO = Path(__file__).resolve().parents[2]
kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (ships the schemas)")


def validate(doc: dict) -> None:
    for version in ("1.28.0", kv.latest_version()):
        kv.validate(doc, version, strict=True)


def render(*argv: str) -> dict:
    res = CliRunner().invoke(cli, list(argv))
    assert res.exit_code == 0, res.output
    return yaml.safe_load(res.stdout)


def test_default_manifest_is_valid_and_narrow() -> None:
    doc = render()
    validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["nodeSelector"] == {"gpu": "on"}
    assert doc["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert c["resources"]["limits"] and c["resources"]["requests"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    # CHOWN keeps the live file's owner; SYS_PTRACE reads /proc/PID/maps of other users' processes (hostPID)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "SYS_PTRACE"]}
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["hostPID"] is True and "hostNetwork" not in pod
    assert pod["priorityClassName"] == "system-node-critical"  # kube-system: admitted there
    host_paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert host_paths == ["/usr/local/vgpu"]  # the library directory only
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {f"{HOST_ROOT}/usr/local/vgpu", f"{HOST_ROOT}/tmp"} <= mounts  # swap uploads land on an emptyDir
    # probes start no interpreter: the kubelet's own HTTP GET on the agent's port
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert c["command"] == ["vgpu-patch", "agent"] and "--metrics-port" in c["args"]
    assert c["args"][-2:] == ["--report", "off"]


def test_options_reach_the_manifest() -> None:
    sha = "ab" * 32
    doc = render("--image", "reg.example/agent:9", "--namespace", "gpu-ops",
                 "--node-selector", "nvidia.com/gpu.present=true", "--node-selector", "gpu=on",
                 "--host-dir", "/opt/vgpu/", "--sha256", sha.upper(), "--metrics-port", "0",
                 "--max-unavailable", "25%", "--priority-class", "")
    validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert doc["metadata"]["namespace"] == "gpu-ops" and c["image"] == "reg.example/agent:9"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "on"}
    assert pod["volumes"][0]["hostPath"]["path"] == "/opt/vgpu"
    assert ["--sha256", sha] == c["args"][c["args"].index("--sha256"):][:2]
    assert "ports" not in c and "--metrics-port" not in c["args"]
    # no port: readiness is `test -e` of the ready marker, liveness the status file's age (no Python either way)
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-e", "/run/vgpu-patch/ready"]
    assert c["livenessProbe"]["exec"]["command"][:2] == ["sh", "-c"]
    assert "-lt 120" in c["livenessProbe"]["exec"]["command"][2]
    assert "priorityClassName" not in pod
    assert doc["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "25%"


@pytest.mark.parametrize("argv", [["--node-selector", "gpu"], ["--node-selector", "bad key=1"],
                                  ["--namespace", "Bad_NS"],
                                  ["--host-dir", "/usr"], ["--sha256", "xyz"], ["--max-unavailable", "many"],
                                  ["--namespace", "gpu-ops", "--priority-class", "system-node-critical"],
                                  ["--toleration", "a=b:Sometimes"], ["--selinux", "colour=red"],
                                  ["--image-pull-secret", "Bad Name"],
                                  ["--memory-limit", "12XB"], ["--cpu-limit", "lots"], ["--cpu-limit", "-1"],
                                  ["--memory-limit", "128Mi\n"], ["--name", "agent\n"],
                                  ["--image", "Reg.Example/Agent:1"], ["--image", "agent:bad tag"]])
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "daemonset", *argv], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("ref", "want"), [
    ("reg.example/agent:9", "reg.example/agent:9"),
    ("localhost:5000/ops/agent", "localhost:5000/ops/agent:0.1.0"),  # no tag: this version
    ("library/agent:1.2", "library/agent:1.2"),  # no dot, colon or localhost: a path, not a registry
    (f"reg.example:443/agent@sha256:{'d' * 64}", f"reg.example:443/agent@sha256:{'d' * 64}"),
])
def test_image_reference_is_split_as_the_chart_spells_it(ref: str, want: str) -> None:
    from vgpu_patch.k8s.daemonset import ImageRef

    img = ImageRef.parse(ref)
    assert img.reference() == want
    assert render("--image", ref, "--image-pull-policy", "Always")["spec"]["template"]["spec"]["containers"][0][
        "imagePullPolicy"] == "Always"


@pytest.mark.parametrize("quantity", ["200m", "0.5", "1", "128Mi", "1Gi", "1e3", "1.5G", ".5"])
def test_kubernetes_quantities_are_taken(quantity: str) -> None:
    c = render("--cpu-limit", quantity, "--memory-limit", quantity)["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"cpu": quantity, "memory": quantity}


def test_json_output_is_one_document(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["--json"])
    assert res.exit_code == 0
    validate(json.loads(res.stdout))
    out = tmp_path / "ds.yaml"
    res = CliRunner().invoke(cli, ["-o", str(out)])
    assert res.exit_code == 0 and yaml.safe_load(out.read_text())["kind"] == "DaemonSet"


def test_shipped_example_is_the_default_render() -> None:
    shipped = (REPO / "deploy" / "daemonset.yaml").read_text()
    assert shipped == render_yaml(DaemonSetOptions()), "re-render: vgpu-patch daemonset -o deploy/daemonset.yaml"
    validate(yaml.safe_load(shipped))


def test_dockerfile_matches_the_agent() -> None:
    text = (REPO / "deploy" / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    # pinned by a real digest (64 hex digits), never a bare tag
    assert re.fullmatch(r"docker\.io/library/python:3\.11[.\d]*-slim-bookworm@sha256:[0-9a-f]{64}", base.group(1))
    copy = re.search(r"^COPY out/libvgpu\.so\* (\S+)$", text, re.M)
    assert copy and copy.group(1).rstrip("/") == IMAGE_LIB_DIR
    manifest = default_manifest(Path("libvgpu.so")).name  # the manifest the agent reads: the build needs it
    assert f"RUN test -f {IMAGE_LIB_DIR}/{manifest} &&" in text
    # the build context holds exactly the library, its manifest and its signature (agent --allowed-signers)
    admitted = {ln[1:] for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.startswith("!out/libvgpu")}
    assert admitted == {"out/libvgpu.so", f"out/{manifest}", "out/libvgpu.so.sig"}
    assert 'ENTRYPOINT ["vgpu-patch", "agent"]' in text
    # the core install, pinned, offline, checked; and every subcommand's --help runs in the image
    # the tool without its dependencies, then the agent's pins (no paramiko), offline, checked
    assert "pip install --no-index --find-links /tmp/wheels --no-deps vgpu-patch -r /tmp/agent-constraints.txt" in text
    assert "pip check" in text
    from vgpu_patch.cli import COMMANDS

    loop = re.search(r'for c in "" ([a-z -]+); do', text)
    assert loop and loop.group(1).split() == COMMANDS



def test_agent_constraints_pin_every_core_dependency_but_the_ssh_stack() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for line in (REPO / "deploy" / "agent-constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r}: the image's constraints pin exact versions"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for dep in deps:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~; \[]", dep)[0]).lower()
        assert name in pins or name == "paramiko", f"{dep} is not pinned in deploy/agent-constraints.txt"
    assert not {"paramiko", "cryptography", "bcrypt", "pynacl", "invoke", "cffi", "pycparser"} & set(pins)


@pytest.mark.parametrize("command", ["agent", "daemonset"])
def test_help_has_an_example(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", command, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Examples:" in proc.stdout and f"vgpu-patch {command}" in proc.stdout


def test_priority_class_only_where_kubernetes_admits_it() -> None:
    assert render()["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert "priorityClassName" not in render("--namespace", "gpu-ops")["spec"]["template"]["spec"]
    own = render("--namespace", "gpu-ops", "--priority-class", "gpu-agents")
    assert own["spec"]["template"]["spec"]["priorityClassName"] == "gpu-agents"


def test_tolerations_pull_secrets_selinux_and_rbac() -> None:
    res = CliRunner().invoke(cli, ["--rbac", "--toleration", "dedicated=gpu:NoExecute", "--toleration", "maintenance",
                                   "--toleration", "*", "--image-pull-secret", "regcred", "--selinux", "type=spc_t",
                                   "--selinux", "level=s0:c1,c2", "--namespace", "gpu-ops"])
    assert res.exit_code == 0, res.output
    docs = list(yaml.safe_load_all(res.stdout))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]
    for d in docs:
        validate(d)
    sa, role, binding, ds = docs
    assert sa["metadata"]["namespace"] == "gpu-ops" and "namespace" not in role["metadata"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
                             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vgpu-patch-agent", "namespace": "gpu-ops"}]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "vgpu-patch-agent" and pod["automountServiceAccountToken"] is True
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"},
        {"key": "maintenance", "operator": "Exists"},
        {"operator": "Exists"},
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = pod["containers"]
    assert c["securityContext"]["seLinuxOptions"] == {"type": "spc_t", "level": "s0:c1,c2"}
    assert c["args"][-2:] == ["--report", "on"]
    j = CliRunner().invoke(cli, ["--rbac", "--json"])
    doc = json.loads(j.stdout)
    assert doc["kind"] == "List" and [i["kind"] for i in doc["items"]][-1] == "DaemonSet"


def test_no_host_pid_means_no_ptrace_and_no_scan() -> None:
    doc = render("--no-host-pid")
    validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["hostPID"] is False and c["securityContext"]["capabilities"]["add"] == ["CHOWN"]
    assert "--no-stale-scan" in c["args"]


@pytest.mark.parametrize("argv", [[], ["--no-host-pid", "--metrics-port", "0"]])
def test_the_rendered_args_run_the_agent(argv: list[str], image: Image, host: Host, tmp_path: Path) -> None:
    """The container's args, with the image's and host's paths swapped for the test's, make a working agent."""
    from vgpu_patch.commands.agent import cli as agent_cli
    from vgpu_patch.k8s.daemonset import READY_FILE, STATUS_FILE

    (c,) = render(*argv)["spec"]["template"]["spec"]["containers"]
    status = tmp_path / "run" / "agent.json"
    swap = {f"{IMAGE_LIB_DIR}/libvgpu.so": str(image.library), HOST_ROOT: str(host.root), STATUS_FILE: str(status)}
    args = [swap.get(a, a) for a in c["args"]]
    if "--metrics-port" in args:  # --once serves nothing; keep the flag's value valid
        args[args.index("--metrics-port") + 1] = "0"
    res = CliRunner().invoke(agent_cli, [*args, "--once", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ready"] and doc["api"] == "off" and doc["stale_scanned"] == ("--no-host-pid" not in argv)
    assert Path(READY_FILE) == Path(STATUS_FILE).with_name("ready")  # the exec probe's file is the agent's marker
    assert status.with_name("ready").exists()


def test_an_allowed_signers_configmap_is_mounted_read_only_and_passed_to_the_agent() -> None:
    doc = render("--allowed-signers-configmap", "release-keys", "--allowed-signers-key", "keys.txt")
    validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    i = c["args"].index("--allowed-signers")
    assert c["args"][i + 1] == "/etc/vgpu-patch/allowed_signers"
    assert {"name": "allowed-signers", "mountPath": "/etc/vgpu-patch", "readOnly": True} in c["volumeMounts"]
    assert {"name": "allowed-signers", "configMap": {"name": "release-keys", "items": [
        {"key": "keys.txt", "path": "allowed_signers"}]}} in pod["volumes"]
    plain = render()["spec"]["template"]["spec"]  # without the option: no mount, no flag
    assert "--allowed-signers" not in plain["containers"][0]["args"]
    assert all(v["name"] != "allowed-signers" for v in plain["volumes"])


@pytest.mark.parametrize(("args", "words"), [
    (["--allowed-signers-configmap", "Release_Keys"], "--allowed-signers-configmap 'Release_Keys': not a valid"),
    (["--allowed-signers-configmap", "keys", "--allowed-signers-key", "a/b"], "--allowed-signers-key 'a/b'"),
])
def test_a_bad_allowed_signers_configmap_or_key_is_a_usage_error(args: list[str], words: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "daemonset", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr
