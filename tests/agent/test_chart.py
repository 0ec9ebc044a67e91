"""charts/vgpu-patch-agent renders exactly what `vgpu-patch daemonset` renders, for each option set.

Rendered, linted and schema-checked by the real helm (tests/agent/helm_bin.py: $VGPU_TEST_HELM or helm on
PATH; CI fetches the pinned v4.1.4 with .ci/fetch_helm.py), for several Kubernetes versions, and every
rendered object validated against that version's schemas. Without helm those tests skip, saying how to get it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_bin import Helm

from vgpu_patch import __version__
from vgpu_patch.k8s.daemonset import (
    AllowedSigners,
    DaemonSetOptions,
    ImageRef,
    chart_files,
    chart_values,
    parse_toleration,
    render_all,
    values_schema,
)

CHART = Path(__file__).resolve().parents[2] / "charts" / "vgpu-patch-agent"
kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (ships the schemas)")
# the chart's floor (Chart.yaml kubeVersion), versions between, and the newest kubernetes-validate knows
K8S_VERSIONS = tuple(dict.fromkeys(("1.25.0", "1.28.0", "1.31.0", "1.35.0", kv.latest_version())))

# the chart refuses its default image (in no registry) unless it is pulled from a registry or loaded by hand
PUSHED = ImageRef.parse("registry.example.com/vgpu-patch-agent")
REGISTRY = ("--set", "image.registry=registry.example.com")
CASES: dict[str, DaemonSetOptions] = {
    "defaults-but-the-registry": DaemonSetOptions(image=PUSHED),
    "image-loaded-by-hand": DaemonSetOptions(image=ImageRef(pull_policy="Never")),
    "gpu-ops-rbac": DaemonSetOptions(namespace="gpu-ops", rbac=True,
                                     image=ImageRef.parse("reg.example/vgpu-patch-agent:1.2", "Always")),
    "image-by-digest": DaemonSetOptions(image=ImageRef.parse(f"localhost:5000/ops/agent@sha256:{'c' * 64}")),
    "no-metrics-no-hostpid": DaemonSetOptions(image=PUSHED, metrics_port=None, host_pid=False, interval=45.0,
                                              sha256="ab" * 32),
    "fleet-knobs": DaemonSetOptions(
        image=PUSHED, namespace="gpu-ops", priority_class="gpu-agents",
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=[parse_toleration("dedicated=gpu:NoExecute"), parse_toleration("*")],
        image_pull_secrets=["regcred", "mirror"], selinux={"type": "spc_t", "level": "s0"}, max_unavailable="25%",
        host_dir="/opt/vgpu/", tolerate_gpu_taint=False, interval=2.5, cpu_limit="500m", memory_limit="256Mi"),
    "no-priority-empty-selector": DaemonSetOptions(image=PUSHED, priority_class=None, node_selector={}),
    "allowed-signers": DaemonSetOptions(image=PUSHED, allowed_signers=AllowedSigners("release-keys")),
    "allowed-signers-key-no-metrics": DaemonSetOptions(
        image=PUSHED, metrics_port=None, namespace="gpu-ops",
        allowed_signers=AllowedSigners("ops.signers", "keys.txt")),
}


def by_kind(docs: list[dict]) -> list[dict]:
    return sorted(docs, key=lambda d: d["kind"])


def values_file(opts: DaemonSetOptions, tmp: Path) -> str:
    path = tmp / "values.json"
    path.write_text(json.dumps(chart_values(opts)))
    return str(path)


def render(helm: Helm, opts: DaemonSetOptions, tmp: Path, *args: str) -> list[dict]:
    """`helm template -n NAMESPACE -f values.json` with the chart values of these options."""
    return helm.template(CHART, "-n", opts.namespace, "-f", values_file(opts, tmp), *args)


def deployment(docs: list[dict]) -> dict[str, Any]:
    (ds,) = (d for d in docs if d["kind"] == "DaemonSet")
    return ds


def pod_spec(docs: list[dict]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(docs)["spec"]["template"]["spec"]
    return spec


def test_generated_chart_files_are_current() -> None:
    for rel, text in chart_files().items():
        assert (CHART / rel).read_text() == text, f"re-generate: vgpu-patch daemonset --write-chart {CHART}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert yaml.safe_load((CHART / "values.yaml").read_text()) == chart_values()


@pytest.mark.parametrize("case", list(CASES))
def test_chart_renders_what_the_cli_renders(case: str, helm: Helm, tmp_path: Path) -> None:
    """values = chart_values(options): the chart's objects equal `vgpu-patch daemonset`'s."""
    opts = CASES[case]
    assert by_kind(render(helm, opts, tmp_path)) == by_kind(render_all(opts))


def test_default_values_and_a_registry_give_the_shipped_manifest_there(helm: Helm) -> None:
    """`helm template --set image.registry=R` == `vgpu-patch daemonset --image R/vgpu-patch-agent` ==
    deploy/daemonset.yaml with that image."""
    shipped = [d for d in yaml.safe_load_all((CHART.parents[1] / "deploy" / "daemonset.yaml").read_text()) if d]
    assert shipped == render_all(DaemonSetOptions())
    pod_spec(shipped)["containers"][0]["image"] = "registry.example.com/vgpu-patch-agent:" + __version__
    assert helm.template(CHART, "-n", "kube-system", *REGISTRY) == shipped
    assert render_all(DaemonSetOptions(image=PUSHED)) == shipped


@pytest.mark.parametrize("command", ["template", "install --dry-run=client"])
def test_the_default_image_is_refused_before_anything_is_installed(command: str, helm: Helm) -> None:
    """The default image is in no registry: helm stops with what to do (not exit 0 and an ImagePullBackOff)."""
    out = helm.run(*command.split(), "vgpu-patch-agent", str(CHART), "-n", "kube-system")
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert ("image.registry is not set, and no registry has the image vgpu-patch-agent: build and push it first "
            f"(deploy/build-multiarch.sh REGISTRY/vgpu-patch-agent:{__version__} --push from a vgpu-patch "
            "checkout), then --set image.registry=REGISTRY; or --set image.pullPolicy=Never for an image loaded into "
            "every node by hand") in out.stderr
    for fix in ("image.registry=registry.example.com", "image.pullPolicy=Never",
                "image.repository=myorg/vgpu-patch-agent"):  # Docker Hub: an org's repository, no registry
        assert helm.run("template", "vgpu-patch-agent", str(CHART), "--set", fix).returncode == 0, fix


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_each_case_renders_valid_objects_for_kubernetes(version: str, helm: Helm, tmp_path: Path) -> None:
    """`helm template --kube-version V`: the same objects, each valid (strict) against V's schemas."""
    for opts in CASES.values():
        docs = render(helm, opts, tmp_path, "--kube-version", version)
        assert by_kind(docs) == by_kind(render_all(opts))
        for doc in docs:
            kv.validate(doc, version, strict=True)


def test_a_kubernetes_below_the_charts_floor_is_refused(helm: Helm) -> None:
    out = helm.run("template", "vgpu-patch-agent", str(CHART), "--kube-version", "1.24.0")
    assert out.returncode != 0
    assert "requires kubeVersion: >=1.25.0-0" in out.stderr


@pytest.mark.parametrize("case", ["chart-defaults", *CASES])
def test_helm_lint_strict(case: str, helm: Helm, tmp_path: Path) -> None:
    """`helm lint --strict` (warnings fail too) with the chart's own values and with each case's."""
    args = [] if case == "chart-defaults" else ["-n", CASES[case].namespace, "-f", values_file(CASES[case], tmp_path)]
    out = helm.check("lint", "--strict", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize(("setting", "complaint"), [
    ("metricsPort=notanumber", "at '/metricsPort': got string, want null or integer"),
    ("metricsPort=70000", "at '/metricsPort'"),
    ("interval=0.1", "at '/interval'"),
    ("hostPID=yes", "at '/hostPID': got string, want boolean"),
    ("maxUnavailable=many", "at '/maxUnavailable'"),
    ("tolerations=all", "at '/tolerations'"),
    ("nodeSelektor.gpu=on", "additional properties 'nodeSelektor' not allowed"),
    ("image=reg.example/agent:1", "at '/image': got string, want object"),
    ("image.repository=Agent", "at '/image/repository'"),
    ("image.tag=1 2", "at '/image/tag'"),
    ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
    ("image.registry=reg example", "at '/image/registry'"),
    ("memoryLimit=12XB", "at '/memoryLimit'"),
    ("cpuLimit=lots", "at '/cpuLimit'"),
    ("cpuRequest=-1", "at '/cpuRequest'"),
    ("fullnameOverride=Agent_1", "at '/fullnameOverride'"),
    ("priorityClassName=gpu agents", "at '/priorityClassName'"),
    ("allowedSigners.configMap=Release_Keys", "at '/allowedSigners/configMap'"),
    ("allowedSigners.key=a/b", "at '/allowedSigners/key'"),
    ("allowedSigners=keys", "at '/allowedSigners': got string, want object"),
])
def test_helm_enforces_the_values_schema(setting: str, complaint: str, helm: Helm) -> None:
    """values.schema.json is checked by helm itself, before any template runs."""
    out = helm.run("template", "vgpu-patch-agent", str(CHART), "--set", setting)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert complaint in out.stderr


def test_values_schema_is_the_generated_one_and_takes_every_case() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema == values_schema()
    for opts in [DaemonSetOptions(), *CASES.values()]:
        jsonschema.validate(chart_values(opts), schema)


def test_system_priority_class_outside_kube_system_fails(helm: Helm) -> None:
    """The chart `fail`s where the CLI gives a usage error; `auto` means none outside kube-system."""
    out = helm.run("template", "vgpu-patch-agent", str(CHART), "-n", "gpu-ops", *REGISTRY,
                   "--set", "priorityClassName=system-node-critical")
    assert out.returncode != 0
    assert "system-* priority classes only in kube-system" in out.stderr
    assert "priorityClassName" not in pod_spec(helm.template(CHART, "-n", "gpu-ops", *REGISTRY))
    kube_system = pod_spec(helm.template(CHART, "-n", "kube-system", *REGISTRY,
                                         "--set", "priorityClassName=system-node-critical"))
    assert kube_system["priorityClassName"] == "system-node-critical"


def test_set_style_numbers_render_like_the_cli(helm: Helm) -> None:
    """`helm --set` types 2, 30, 9500 and 1 as numbers; the objects are the CLI's for the same options."""
    got = helm.template(CHART, "-n", "kube-system", *REGISTRY,
                        "--set", "maxUnavailable=2,interval=30,metricsPort=9500,cpuLimit=1,memoryRequest=64")
    want = render_all(DaemonSetOptions(image=PUSHED, max_unavailable="2", interval=30.0, metrics_port=9500,
                                       cpu_limit="1", memory_request="64"))
    assert got == want


def test_a_node_selector_replaces_the_default_one(helm: Helm) -> None:
    """helm merges a user's map into the chart's: values.yaml's null keeps gpu=on out of a user's selector."""
    got = pod_spec(helm.template(CHART, *REGISTRY, "--set-string", r"nodeSelector.nvidia\.com/gpu\.present=true"))
    assert got["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod_spec(helm.template(CHART, *REGISTRY, "--set", "nodeSelector=null"))["nodeSelector"] == {"gpu": "on"}
    assert pod_spec(helm.template(CHART, *REGISTRY, "--set-json", "nodeSelector={}"))["nodeSelector"] == {}


def test_set_allowed_signers_like_the_cli(helm: Helm) -> None:
    """`--set allowedSigners.configMap=NAME` mounts the ConfigMap and passes --allowed-signers, as the CLI's
    `--allowed-signers-configmap NAME` does."""
    got = helm.template(CHART, "-n", "kube-system", *REGISTRY, "--set", "allowedSigners.configMap=release-keys")
    assert got == render_all(DaemonSetOptions(image=PUSHED, allowed_signers=AllowedSigners("release-keys")))
    (container,) = pod_spec(got)["containers"]
    assert "/etc/vgpu-patch/allowed_signers" in container["args"]
    assert {"name": "allowed-signers", "mountPath": "/etc/vgpu-patch", "readOnly": True} in container["volumeMounts"]


def test_set_image_parts_like_hamis_chart(helm: Helm) -> None:
    """`--set image.registry=…,image.repository=…,image.tag=…` give the CLI's `--image REF` objects."""
    got = helm.template(CHART, "-n", "kube-system", "--set",
                        "image.registry=registry.example.com:5000,image.repository=ops/vgpu-patch-agent,"
                        "image.tag=0.1.0-rc1,image.pullPolicy=Always")
    want = DaemonSetOptions(image=ImageRef.parse("registry.example.com:5000/ops/vgpu-patch-agent:0.1.0-rc1", "Always"))
    assert got == render_all(want)
    (container,) = pod_spec(got)["containers"]
    assert container["image"] == "registry.example.com:5000/ops/vgpu-patch-agent:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    only_repo = pod_spec(helm.template(CHART, "--set", "image.repository=mirror/agent"))["containers"][0]["image"]
    assert only_repo == f"mirror/agent:{__version__}"  # an empty tag is the chart's appVersion


INJECTIONS = {"priorityClassName": "x\nhostNetwork: true", "fullnameOverride": "agent\nhostNetwork: true",
              "sha256": "ab\nhostNetwork: true", "hostDir": "/opt/x\nhostNetwork: true",
              "maxUnavailable": "1\nhostNetwork: true", "cpuLimit": "1\nhostNetwork: true"}


@pytest.mark.parametrize("key", list(INJECTIONS))
def test_a_value_with_a_newline_is_refused_and_never_becomes_yaml(key: str, helm: Helm, tmp_path: Path) -> None:
    """The schema refuses the value; with the schema skipped, the template's quoting still keeps it one string."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({key: INJECTIONS[key]}))
    out = helm.run("template", "vgpu-patch-agent", str(CHART), "-n", "kube-system", "-f", str(values))
    assert out.returncode != 0 and f"at '/{key}'" in out.stderr
    skipped = helm.run("template", "vgpu-patch-agent", str(CHART), "-n", "kube-system", "-f", str(values),
                       "--skip-schema-validation")
    if skipped.returncode == 0:  # else a template refused it: no YAML came out at all
        docs = [d for d in yaml.safe_load_all(skipped.stdout) if d]
        assert "hostNetwork" not in pod_spec(docs)


def test_notes_say_how_to_build_push_and_use_the_image(helm: Helm) -> None:
    """`helm install` prints NOTES.txt: the build script exists, and its --set line gives the tag it pushes."""
    out = helm.check("install", "agent", str(CHART), "-n", "kube-system", "--dry-run=client",
                     "--set", "image.registry=registry.example.com")
    notes = out[out.index("NOTES:"):]
    assert "image registry.example.com/vgpu-patch-agent:0.1.0." in " ".join(notes.split())
    build = next(ln.split() for ln in notes.splitlines() if "build-multiarch.sh" in ln)
    assert (CHART.parents[1] / build[0]).is_file() and build[2] == "--push"
    setting = next(ln.split("--set ")[1] for ln in notes.splitlines() if "--set image.registry=" in ln)
    got = pod_spec(helm.template(CHART, "--set", setting.replace("REGISTRY", "reg.example")))["containers"][0]
    assert got["image"] == build[1].replace("REGISTRY", "reg.example")


DOCS_WITH_HELM = ["README.md", "docs/fleet.md", "charts/vgpu-patch-agent/README.md", "docs/signing.md"]


@pytest.mark.parametrize("doc", DOCS_WITH_HELM)
def test_documented_helm_install_gives_the_documented_daemonset(doc: str, helm: Helm) -> None:
    """Each doc's `helm install …` line, run (`--dry-run=client`), renders the objects of the doc's
    `vgpu-patch daemonset --image … [--rbac]` line: the two are the same install."""
    import shlex

    from click.testing import CliRunner

    from vgpu_patch.commands.daemonset import cli as daemonset

    text = (CHART.parents[1] / doc).read_text().replace("\\\n", " ")
    install = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("helm install")).split("#")[0])
    cli_line = next(ln for ln in text.splitlines() if ln.startswith("vgpu-patch daemonset --image"))
    cli_args = shlex.split(cli_line.split("|")[0].split(" -o ")[0])[2:]
    assert ("rbac=true" in " ".join(install)) == ("--rbac" in cli_args), "the two lines ask for different RBAC"
    chart_arg = install.index("charts/vgpu-patch-agent")
    install[chart_arg] = str(CHART)
    out = helm.check(*install[1:], "--dry-run=client")
    rendered = [d for d in yaml.safe_load_all(out.split("NOTES:")[0].split("MANIFEST:")[1]) if d]
    res = CliRunner().invoke(daemonset, [*cli_args, "--json"])
    assert res.exit_code == 0, res.output
    doc_json = json.loads(res.stdout)
    want = doc_json["items"] if doc_json["kind"] == "List" else [doc_json]
    assert by_kind(rendered) == by_kind(want)
