"""--host-dir and the chart's hostDir: one rule. Normalised, the path must be a directory under /usr/local, /opt or
/var/lib, and spelled normalised (the chart's schema cannot normalise); the CLI and values.schema.json (the
generated file, checked with a JSON-schema validator; helm applies the same file) accept and refuse alike."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helm_bin import Helm

from vgpu_patch.k8s.daemonset import values_schema

CHART = Path(__file__).resolve().parents[2] / "charts" / "vgpu-patch-agent"
jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema")

REFUSED = ["/", "/etc", "/usr/local/vgpu/../../../etc", "/usr/local/vgpu/..", "/usr/local", "/usr/local/",
           "/usr", "/opt", "/var/lib/", "/srv/vgpu", "/usr/local/./vgpu", "/usr/local//vgpu", "/opt/x/../y",
           "usr/local/vgpu", "", "/usr/localx/vgpu", "/opt/vgpu\nhostNetwork: true", "//usr/local/vgpu"]
ALLOWED = ["/usr/local/vgpu", "/usr/local/vgpu/", "/opt/vgpu", "/var/lib/vgpu/lib", "/opt/.vgpu", "/opt/a..b",
           "/opt/..vgpu", "/usr/local/vgpu-2.6.0"]


def cli_accepts(host_dir: str) -> tuple[bool, str]:
    p = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "daemonset", "--host-dir", host_dir],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 2), p.stderr
    return p.returncode == 0, p.stderr


def schema_accepts(host_dir: str) -> bool:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema == values_schema()  # the chart's file is the generated one
    return not list(jsonschema.Draft7Validator(schema).iter_errors({"hostDir": host_dir}))


@pytest.mark.parametrize("host_dir", REFUSED)
def test_a_host_dir_outside_the_roots_or_not_normalised_is_refused_by_both(host_dir: str) -> None:
    ok, err = cli_accepts(host_dir)
    assert not ok and len(err.strip().splitlines()) == 1 and "--host-dir" in err, err
    assert not schema_accepts(host_dir)


@pytest.mark.parametrize("host_dir", ALLOWED)
def test_a_directory_under_the_roots_is_taken_by_both(host_dir: str) -> None:
    ok, err = cli_accepts(host_dir)
    assert ok, err
    assert schema_accepts(host_dir)


def test_the_refusal_says_what_to_give() -> None:
    _, err = cli_accepts("/usr/local/vgpu/../../../etc")
    assert "not a directory under /usr/local, /opt or /var/lib" in err
    _, err = cli_accepts("/opt/x/../vgpu")
    assert "give it as /opt/vgpu" in err


def test_helm_applies_the_same_rule(helm: Helm, tmp_path: Path) -> None:  # the fixture skips without helm
    """The real helm (Go's regexp, not Python's) refuses and renders exactly as the CLI does."""
    import yaml

    for host_dir, ok in [*((d, False) for d in REFUSED), *((d, True) for d in ALLOWED)]:
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({"hostDir": host_dir, "image": {"registry": "reg.example"}}))
        out = helm.run("template", "vgpu-patch-agent", str(CHART), "-n", "kube-system", "-f", str(values))
        assert (out.returncode == 0) is ok, (host_dir, out.stderr[:300])
        if ok:
            docs = [d for d in yaml.safe_load_all(out.stdout) if d]
            pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
            host_lib = next(v for v in pod["volumes"] if v["name"] == "host-lib")
            assert host_lib["hostPath"]["path"] == host_dir.rstrip("/")
