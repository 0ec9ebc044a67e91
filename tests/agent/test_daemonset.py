"""`vgpu-patch daemonset`, deploy/daemonset.yaml and deploy/Dockerfile, validated offline."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from vgpu_patch.agent.image import default_manifest
from vgpu_patch.commands.daemonset import cli
from vgpu_patch.daemonset import HOST_ROOT, IMAGE_LIB_DIR, DaemonSetOptions, render_yaml

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
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert pod["automountServiceAccountToken"] is False and "hostPID" not in pod and "hostNetwork" not in pod
    host_paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert host_paths == ["/usr/local/vgpu"]  # the library directory only
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {f"{HOST_ROOT}/usr/local/vgpu", f"{HOST_ROOT}/tmp"} <= mounts  # swap uploads land on an emptyDir
    probe = c["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["vgpu-patch", "agent", "--probe"] and "--host-root" in probe
    assert c["command"] == ["vgpu-patch", "agent"] and "--metrics-port" in c["args"]


def test_options_reach_the_manifest() -> None:
    sha = "ab" * 32
    doc = render("--image", "reg.example/agent:9", "--namespace", "gpu-ops",
                 "--node-selector", "nvidia.com/gpu.present=true", "--node-selector", "gpu=on",
                 "--host-dir", "/srv/vgpu/", "--sha256", sha.upper(), "--metrics-port", "0",
                 "--max-unavailable", "25%", "--priority-class", "")
    validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert doc["metadata"]["namespace"] == "gpu-ops" and c["image"] == "reg.example/agent:9"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "on"}
    assert pod["volumes"][0]["hostPath"]["path"] == "/srv/vgpu"
    assert ["--sha256", sha] == c["args"][c["args"].index("--sha256"):][:2]
    assert sha in c["readinessProbe"]["exec"]["command"]
    assert "ports" not in c and "livenessProbe" not in c and "--metrics-port" not in c["args"]
    assert "priorityClassName" not in pod
    assert doc["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "25%"


@pytest.mark.parametrize("argv", [["--node-selector", "gpu"], ["--node-selector", "bad key=1"],
                                  ["--namespace", "Bad_NS"], ["--host-dir", "/usr"], ["--sha256", "xyz"],
                                  ["--max-unavailable", "many"]])
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "daemonset", *argv], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1


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
    assert "@sha256:" in base.group(1) and "python:3.11-slim" in base.group(1)  # pinned by digest, never a bare tag
    copy = re.search(r"^COPY out/libvgpu\.so out/(\S+) (\S+)$", text, re.M)
    assert copy and copy.group(2).rstrip("/") == IMAGE_LIB_DIR
    assert copy.group(1) == default_manifest(Path("libvgpu.so")).name  # the manifest the agent reads
    assert 'ENTRYPOINT ["vgpu-patch", "agent"]' in text
    # the core install, pinned, offline, checked; and every subcommand's --help runs in the image
    assert "pip install --no-index --find-links /tmp/wheels -c /tmp/agent-constraints.txt vgpu-patch" in text
    assert "pip check" in text
    from vgpu_patch.cli import COMMANDS

    loop = re.search(r'for c in "" ([a-z ]+); do', text)
    assert loop and loop.group(1).split() == COMMANDS


def test_agent_constraints_pin_every_core_dependency() -> None:
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
        assert name in pins, f"{dep} is not pinned in deploy/agent-constraints.txt"


def test_dockerignore_keeps_virtualenvs_and_build_outputs_out() -> None:
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*"  # deny everything, then allow what the Dockerfile copies
    allowed = [ln[1:] for ln in lines[1:]]
    assert all(ln.startswith("!") for ln in lines[1:])
    assert not any(a.startswith((".venv", ".git", "build", "tests", "c_src")) for a in allowed)
    text = (REPO / "deploy" / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in src.split():
            assert any(path.rstrip("/") == a or a.startswith(path.rstrip("/") + "/") for a in allowed), path


@pytest.mark.parametrize("command", ["agent", "daemonset"])
def test_help_has_an_example(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", command, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Examples:" in proc.stdout and f"vgpu-patch {command}" in proc.stdout
