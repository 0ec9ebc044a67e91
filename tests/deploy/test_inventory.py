"""Inventory selection and variables are exactly Ansible's: a corpus of inventories (INI, YAML, JSON, a
dynamic script, group_vars/ and host_vars/) and --limit patterns, each compared with what
`ansible all --list-hosts` and `ansible-inventory --host` print."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vgpu_patch.deploy.inventory import load_inventory
from vgpu_patch.report.errors import UsageError

pytestmark = pytest.mark.skipif(shutil.which("ansible") is None, reason="ansible-core's CLI is not installed")

INI = """\
[gpu]
g[01:04]
gbig ansible_host=10.0.0.50 ansible_port=2222

[zone_a]
g01
g02
gbig

[zone_b]
g03
g04

[canary]
g02

[cpu]
c1

[cluster:children]
gpu
cpu
"""

YAML = """\
all:
  children:
    gpu:
      hosts:
        g01: {ansible_host: 10.1.0.1}
        g02:
        g03: {ansible_user: yamluser}
      children:
        zone_a:
          hosts:
            g01:
            g02:
    canary:
      hosts:
        g02:
"""

JSON = {  # a static JSON inventory has the YAML plugin's shape
    "all": {"children": {
        "gpu": {"hosts": {"j1": {"ansible_port": 2201}, "j2": None, "j3": {"vgpu_patch_target_dir": "/srv/j3"}},
                "vars": {"ansible_user": "jsonuser"}},
        "zone_a": {"hosts": {"j1": None, "j3": None}},
        "canary": {"hosts": {"j3": None}},
    }},
}

SCRIPT = {  # what an inventory script prints for --list
    "gpu": {"hosts": ["j1", "j2", "j3"], "vars": {"ansible_user": "jsonuser"}},
    "zone_a": {"hosts": ["j1", "j3"]},
    "canary": {"hosts": ["j3"]},
    "_meta": {"hostvars": {"j1": {"ansible_port": 2201}, "j3": {"vgpu_patch_target_dir": "/srv/j3"}}},
}

PATTERNS = ["all", "gpu", "gpu:&zone_a", "zone_a:&canary", "gpu:!canary", "gpu:&zone_a:!canary",
            "g0*", "~g0[13]", "cluster:!gpu", "zone_a,zone_b", "gpu[0]", "gpu[1:2]", "!canary", "nosuch,g01"]


def _corpus(tmp: Path) -> dict[str, Path]:
    ini = tmp / "ini"
    (ini / "group_vars").mkdir(parents=True)
    (ini / "host_vars").mkdir()
    (ini / "hosts.ini").write_text(INI)
    (ini / "group_vars" / "gpu.yml").write_text("ansible_user: gpuadmin\nvgpu_patch_target_dir: /opt/gpu\n")
    (ini / "group_vars" / "zone_a.yml").write_text("ansible_port: 2022\n")
    (ini / "host_vars" / "g02.yml").write_text(
        "ansible_host: \"{{ inventory_hostname }}.zone-a.example\"\nvgpu_patch_target_dir: /srv/g02\n")
    yml = tmp / "yaml"
    yml.mkdir()
    (yml / "hosts.yml").write_text(YAML)
    js = tmp / "json"
    js.mkdir()
    (js / "hosts.json").write_text(json.dumps(JSON))
    script = tmp / "dyn" / "inventory.py"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                      f"doc = {SCRIPT!r}\n"
                      "print(json.dumps(doc if '--list' in sys.argv else {}))\n")
    script.chmod(0o755)
    return {"ini": ini / "hosts.ini", "yaml": yml / "hosts.yml", "json": js / "hosts.json", "script": script}


def _ansible_hosts(inv: Path, pattern: str) -> list[str]:
    env = {**os.environ, "ANSIBLE_HOST_PATTERN_MISMATCH": "ignore", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(["ansible", "all", "-i", str(inv), "--limit", pattern, "--list-hosts"],
                          capture_output=True, text=True, env=env, timeout=120)
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("hosts (")]


def _ansible_vars(inv: Path, host: str) -> dict:
    proc = subprocess.run(["ansible-inventory", "-i", str(inv), "--host", host], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _corpus(tmp_path_factory.mktemp("inventories"))


@pytest.mark.parametrize("kind", ["ini", "yaml", "json", "script"])
def test_selection_matches_ansible_list_hosts(corpus: dict[str, Path], kind: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    inv = corpus[kind]
    with ThreadPoolExecutor(4) as pool:
        wanted = list(pool.map(lambda p: _ansible_hosts(inv, p), PATTERNS))
    for pattern, want in zip(PATTERNS, wanted):
        try:
            got = [s.name for s in load_inventory(inv, pattern)]
        except UsageError as e:
            assert want == [], f"{kind} {pattern!r}: ansible selects {want}, we refused: {e}"
            assert "no hosts match" in str(e)
            continue
        assert got == want, f"{kind} --limit {pattern!r}"


@pytest.mark.parametrize("kind", ["ini", "json", "script"])
def test_vars_match_ansible_inventory_host(corpus: dict[str, Path], kind: str) -> None:
    inv = corpus[kind]
    for spec in load_inventory(inv):
        hv = _ansible_vars(inv, spec.name)
        host = hv.get("ansible_host")
        if host and "{{" in str(host):  # ansible-inventory prints templates unrendered
            host = str(host).replace("{{ inventory_hostname }}", spec.name)
        assert spec.hostname == host, spec.name
        assert spec.port == hv.get("ansible_port"), spec.name
        assert spec.user == hv.get("ansible_user"), spec.name
        assert spec.target_dir == hv.get("vgpu_patch_target_dir"), spec.name


def test_group_and_host_vars_dirs(corpus: dict[str, Path]) -> None:
    specs = {s.name: s for s in load_inventory(corpus["ini"], "gpu:&zone_a")}
    assert list(specs) == ["g01", "g02", "gbig"]
    assert specs["g01"].user == "gpuadmin" and specs["g01"].port == 2022 and specs["g01"].target_dir == "/opt/gpu"
    assert specs["g02"].hostname == "g02.zone-a.example" and specs["g02"].target_dir == "/srv/g02"
    assert specs["gbig"].port == 2222  # the host's own variable beats group_vars


def test_old_target_dir_variable_is_accepted_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import vgpu_patch.deploy.inventory as inv_mod

    inv_mod._warned_old_var = False
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu]\nn1 vgpu_target_dir=/old/dir\nn2 vgpu_patch_target_dir=/new vgpu_target_dir=/old\n")
    specs = {s.name: s for s in load_inventory(inv)}
    assert specs["n1"].target_dir == "/old/dir" and specs["n2"].target_dir == "/new"
    err = capsys.readouterr().err
    assert "vgpu_target_dir is deprecated" in err and "vgpu_patch_target_dir" in err and err.count("\n") == 1


def test_unreadable_inventories_are_one_line_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_inventory(tmp_path / "missing.ini")
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts: [unclosed\n")
    with pytest.raises(UsageError) as e:
        load_inventory(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
