"""charts/vgpu-patch-agent renders exactly what `vgpu-patch daemonset` renders, for each option set.

Rendered with `helm template` when a helm binary is on PATH; otherwise with tests/agent/gotemplate.py, a
minimal renderer of the Go-template subset the chart uses (no helm can be installed from the package
registries this project reaches). Every rendered object is validated against several Kubernetes versions.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gotemplate
import pytest
import yaml

from vgpu_patch import __version__
from vgpu_patch.daemonset import (
    DaemonSetOptions,
    chart_files,
    chart_values,
    parse_toleration,
    render_all,
    values_schema,
)

CHART = Path(__file__).resolve().parents[2] / "charts" / "vgpu-patch-agent"
kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (ships the schemas)")
K8S_VERSIONS = ("1.25.0", "1.28.0", "1.31.0", kv.latest_version())

CASES: dict[str, DaemonSetOptions] = {
    "defaults": DaemonSetOptions(),
    "gpu-ops-rbac": DaemonSetOptions(namespace="gpu-ops", rbac=True, image="reg.example/vgpu-patch-agent:1.2"),
    "no-metrics-no-hostpid": DaemonSetOptions(metrics_port=None, host_pid=False, interval=45.0, sha256="ab" * 32),
    "fleet-knobs": DaemonSetOptions(
        namespace="gpu-ops", priority_class="gpu-agents", node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=[parse_toleration("dedicated=gpu:NoExecute"), parse_toleration("*")],
        image_pull_secrets=["regcred", "mirror"], selinux={"type": "spc_t", "level": "s0"}, max_unavailable="25%",
        host_dir="/srv/vgpu/", tolerate_gpu_taint=False, interval=2.5, cpu_limit="500m", memory_limit="256Mi"),
    "no-priority-empty-selector": DaemonSetOptions(priority_class=None, node_selector={}),
}


def helm_render(values: dict[str, Any], namespace: str, tmp: Path) -> list[dict]:
    vfile = tmp / "values.json"
    vfile.write_text(json.dumps(values))
    out = subprocess.run(["helm", "template", "vgpu-patch-agent", str(CHART), "-n", namespace, "-f", str(vfile)],
                         capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def mini_render(values: dict[str, Any], namespace: str) -> list[dict]:
    merged = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text()))
    merged.update(values)  # helm merges -f values over the chart's values.yaml the same way at the top level
    docs: list[dict] = []
    for name in ("rbac.yaml", "daemonset.yaml"):
        text = gotemplate.render((CHART / "templates" / name).read_text(), merged, namespace=namespace,
                                 app_version=__version__)
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def chart_render(values: dict[str, Any], namespace: str, tmp: Path) -> list[dict]:
    return helm_render(values, namespace, tmp) if shutil.which("helm") else mini_render(values, namespace)


def test_generated_chart_files_are_current() -> None:
    for rel, text in chart_files().items():
        assert (CHART / rel).read_text() == text, f"re-generate: vgpu-patch daemonset --write-chart {CHART}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__


@pytest.mark.parametrize("case", list(CASES))
def test_chart_renders_what_the_cli_renders(case: str, tmp_path: Path) -> None:
    """values = chart_values(options): the chart's objects equal `vgpu-patch daemonset`'s, and are valid."""
    opts = CASES[case]
    got = chart_render(chart_values(opts), opts.namespace, tmp_path)
    want = render_all(opts)
    key = lambda d: d["kind"]  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)
    for doc in got:
        for version in K8S_VERSIONS:
            kv.validate(doc, version, strict=True)


def test_default_values_give_the_shipped_manifest(tmp_path: Path) -> None:
    """`helm template` with no values at all == `vgpu-patch daemonset` == deploy/daemonset.yaml."""
    shipped = [d for d in yaml.safe_load_all((CHART.parents[1] / "deploy" / "daemonset.yaml").read_text()) if d]
    assert chart_render({}, "kube-system", tmp_path) == shipped == render_all(DaemonSetOptions())


def test_system_priority_class_outside_kube_system_fails(tmp_path: Path) -> None:
    values = {"priorityClassName": "system-node-critical"}
    if shutil.which("helm"):
        with pytest.raises(subprocess.CalledProcessError):
            helm_render(values, "gpu-ops", tmp_path)
    else:
        with pytest.raises(gotemplate.TemplateFail, match="only in kube-system"):
            mini_render(values, "gpu-ops")
    assert "priorityClassName" not in mini_render({}, "gpu-ops")[-1]["spec"]["template"]["spec"]


def test_values_schema_accepts_the_defaults_and_refuses_bad_types() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema == values_schema()
    jsonschema.validate(chart_values(), schema)
    for case in CASES.values():
        jsonschema.validate(chart_values(case), schema)
    jsonschema.validate({**chart_values(), "maxUnavailable": 2, "cpuLimit": 1}, schema)  # as `helm --set` types them
    for bad in ({"metricsPort": "9400"}, {"hostPID": "yes"}, {"tolerations": "all"}, {"nodeSelektor": {}},
                {"maxUnavailable": "many"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**chart_values(), **bad}, schema)


def test_set_style_numbers_render_like_the_cli(tmp_path: Path) -> None:
    """`helm --set maxUnavailable=2 --set interval=30` types them as numbers; the objects are the same."""
    got = chart_render({"maxUnavailable": 2, "interval": 30}, "kube-system", tmp_path)[-1]
    assert got == render_all(DaemonSetOptions(max_unavailable="2", interval=30.0))[-1]
