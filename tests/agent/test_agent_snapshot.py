"""The agent reads the image's library once, at start, into a private snapshot: its sha256, ELF facts, signature
check and every later install (a repair after HAMi's copy-back included) come from that copy. A writer of the
library's directory who renames another file into place between reads, or later, never gets other bytes live
than the ones verified. Every read position, both ways round; real ssh-keygen keys, a temporary host root."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from agent_helpers import Host, build_lib, hami_copy_back, sha
from read_swapper import ReadSwapper, patterns
from signing_keys import allowed_signers, make_key, sign

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.report.errors import VgpuPatchError


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    d = tmp_path_factory.mktemp("keys")
    key = make_key(d, "release@example.com")
    return allowed_signers(d / "allowed_signers", key), key


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lib(tmp_path_factory.mktemp("other"), "libvgpu.so", "vgpu-patch-shim 0.9.9", 9)


def start(library: Path, root: Path, vendor: Path, allowed_file: Path) -> tuple[Host, Agent | None, str]:
    host = Host(root)
    host.libdir.mkdir(parents=True)
    shutil.copy(vendor, host.live)
    try:
        agent = Agent(AgentConfig(library=library, host_root=host.root, allowed_signers=allowed_file, proc=None,
                                  settle=0.0))
        agent.ensure(startup=True)
    except VgpuPatchError as e:
        return host, None, str(e)
    return host, agent, ""


def signed_image(tmp_path: Path, build: Path, key: Path) -> Path:
    """an agent image's library: the build, its signature and its manifest in tmp_path/image"""
    image = tmp_path / "image"
    image.mkdir()
    lib = image / "libvgpu.so"
    shutil.copy(build, lib)
    sign(lib, key)
    (image / "libvgpu.so.json").write_text(json.dumps({"schema": 1, "sha256": sha(lib)}) + "\n")
    return lib


def test_the_agent_installs_only_the_verified_bytes_whatever_read_the_library_is_swapped_at(
        tmp_path: Path, built: dict[str, Path], other: Path, allowed, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed_file, key = allowed
    lib = signed_image(tmp_path, built["ours"], key)
    files = {"signed": built["ours"].read_bytes(), "unsigned": other.read_bytes()}
    manifest = lib.parent / "libvgpu.so.json"
    swapper = ReadSwapper(lib, files).install(monkeypatch)
    swapper.put("signed")
    host, agent, why = start(lib, tmp_path / "count", built["vendor"], allowed_file)
    reads = swapper.reads  # every read of a start that installs it
    assert agent is not None and host.live.read_bytes() == files["signed"], why
    # the writer may rewrite the manifest too (it is in the same directory): to name either build
    for named in ("signed", "unsigned"):
        manifest.write_text(json.dumps({"schema": 1, "sha256": sha(built["ours"] if named == "signed" else other)}))
        for name, plan in patterns(reads, "signed", "unsigned"):
            swapper.reads, swapper.plan = 0, plan
            swapper.put("unsigned" if plan(0) == "signed" else "signed")
            where = f"manifest-{named}-{name}".replace(" ", "-")
            host, agent, why = start(lib, tmp_path / where, built["vendor"], allowed_file)
            live = host.live.read_bytes()
            assert live in (built["vendor"].read_bytes(), files["signed"]), f"{where}: unverified bytes live ({why})"
    assert reads == 1, f"the image's library was opened {reads} times; read it once, into a private snapshot"


def test_a_repair_installs_the_snapshot_not_what_the_image_path_holds_now(
        tmp_path: Path, built: dict[str, Path], other: Path, allowed, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed_file, key = allowed
    lib = signed_image(tmp_path, built["ours"], key)
    host, agent, why = start(lib, tmp_path / "host", built["vendor"], allowed_file)
    assert agent is not None, why
    assert host.live.read_bytes() == built["ours"].read_bytes()
    shutil.copy(other, lib.parent / "swap.tmp")
    (lib.parent / "swap.tmp").rename(lib)  # the image's path now holds another build
    hami_copy_back(built["vendor"], host.live)  # HAMi's device plugin puts its file back
    assert agent.ensure(startup=False) == "reapply"
    assert host.live.read_bytes() == built["ours"].read_bytes()  # the verified snapshot, not the path's new bytes
    assert host.history()[-1]["to_sha256"] == sha(built["ours"])
