"""A file in the library directory whose name holds a tab or a newline: ignored with a warning, never a crash."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from deploy_support import make_node, sha

from vgpu_patch.cli import cli as main


@pytest.mark.parametrize("odd", ["libvgpu.so.1\tx", "libvgpu.so.1\nF\tlibvgpu.so.2", "libvgpu.so.\x01"])
def test_status_deploy_and_rollback_step_over_an_odd_name(odd: str, tmp_path: Path, libs: dict[str, Path]) -> None:
    root = tmp_path / "root"
    d = make_node(root, libs["vendor"])
    shutil.copy(libs["vendor"], d / odd)
    run = CliRunner()

    def cli(*args: str) -> str:
        res = run.invoke(main, [*args, "--local", str(root)])
        assert res.exit_code == 0, res.output
        assert "Traceback" not in res.output and "not enough values" not in res.output
        return res.stderr

    err = cli("status")
    assert "not a plain file name" in err and repr(odd.replace("\t", " ").replace("\n", " ")) in err
    cli("deploy", "--no-check", str(libs["v1"]))
    assert sha(d / "libvgpu.so") == sha(libs["v1"])
    cli("rollback", "--yes")
    assert sha(d / "libvgpu.so") == sha(libs["vendor"])
    assert (d / odd).read_bytes() == libs["vendor"].read_bytes()  # left alone
