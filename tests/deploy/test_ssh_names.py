"""Inventory names never reach a shell, and the inventory's ssh options count, with or without an `ssh` client."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vgpu_patch.deploy.inventory import load_inventory
from vgpu_patch.deploy.targets import HostSpec, SSHSettings, make_transport
from vgpu_patch.deploy.targets import resolve as resolve_spec
from vgpu_patch.report.errors import UsageError


@pytest.fixture(params=["ssh -G", "no ssh client"])
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Both resolvers: OpenSSH's `ssh -G`, and paramiko's SSHConfig on a PATH without `ssh`."""
    if request.param == "ssh -G":
        if shutil.which("ssh") is None:
            pytest.skip("no ssh client installed")
    else:
        bare = tmp_path / "bin"
        bare.mkdir()
        for tool in ("sh", "true", "touch"):  # what a ProxyCommand could run, but no ssh
            (bare / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
        monkeypatch.setenv("PATH", str(bare))
        assert shutil.which("ssh") is None
    return str(request.param)


def config(tmp_path: Path) -> str:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  ProxyCommand true %h %n %r\n  Port 2200\n")
    return str(cfg)


@pytest.mark.parametrize("name", ["$(touch PWNED)", "`touch PWNED`", "gpu;touch PWNED", "a b", "-oProxyCommand=x",
                                  "gpu|touch PWNED", "gpu\ntouch PWNED"])
def test_a_host_name_with_shell_syntax_is_refused_before_any_shell(client: str, name: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = HostSpec(name="node", hostname=name)
    with pytest.raises(UsageError, match="not a host name") as e:
        t = make_transport(spec, config=SSHSettings(config=config(tmp_path)))
        t.run("true", warn=True)  # before the check, this connected through the ProxyCommand's shell
    assert "\n" not in str(e.value).replace(repr(name), "")
    assert not (tmp_path / "PWNED").exists()


def test_a_user_name_with_shell_syntax_is_refused(client: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a user name"):
        resolve_spec(HostSpec(name="n", hostname="gpu-1", user="$(id)"), SSHSettings(config=config(tmp_path)))


def test_plain_names_pass(client: str, tmp_path: Path) -> None:
    for host in ("gpu-01", "gpu_01.example.com", "10.0.0.5", "::1", "fe80::1%eth0"):
        opts = resolve_spec(HostSpec(name=host, hostname=host, user="admin.ops"), SSHSettings(config=config(tmp_path)))
        assert opts.hostname == host and opts.user == "admin.ops"


def test_the_inventorys_port_and_ssh_args_count(client: str, tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu]\n"
                   "by-var ansible_host=10.0.0.1 ansible_port=2222\n"
                   "by-args ansible_host=10.0.0.2 ansible_ssh_common_args='-o Port=2223 -l ops -o ConnectTimeout=7'\n"
                   "by-flag ansible_host=10.0.0.3 ansible_ssh_extra_args='-p 2224'\n"
                   "from-config ansible_host=10.0.0.4\n")
    settings = SSHSettings(config=config(tmp_path))
    got = {s.name: resolve_spec(s, settings) for s in load_inventory(inv)}
    assert {n: o.port for n, o in got.items()} == {"by-var": 2222, "by-args": 2223, "by-flag": 2224,
                                                   "from-config": 2200}
    assert got["by-args"].user == "ops" and got["by-args"].connect_timeout == 7.0
    assert all(o.proxy_command for o in got.values())
