"""Fixtures for the agent tests: a temporary host root, tiny real shared objects built with gcc, and helm."""
from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import TIMEOUT, Host, Image, build_lib, sha, wait_for
from helm_bin import HOW_TO_GET, Helm, find_helm

from vgpu_patch.agent import Agent, AgentConfig


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test libraries")
    d = tmp_path_factory.mktemp("agentlibs")
    return {"vendor": build_lib(d, "vendor.so", "HAMi-core vendor build", 0),
            "ours": build_lib(d, "libvgpu.so", "vgpu-patch-shim 0.1.0", 1)}


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The real helm (tests/agent/helm_bin.py); the tests that need it skip without one."""
    path = find_helm()
    if path is None:
        pytest.skip(HOW_TO_GET)
    return Helm(path, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture
def image(built: dict[str, Path], tmp_path: Path) -> Image:
    """/opt/vgpu-patch of the image: libvgpu.so plus libvgpu.so.json (the build manifest)."""
    d = tmp_path / "image"
    d.mkdir()
    lib = d / "libvgpu.so"
    shutil.copy(built["ours"], lib)
    (d / "libvgpu.so.json").write_text(json.dumps({"schema": 1, "sha256": sha(lib)}) + "\n")
    return Image(lib, sha(lib))


@pytest.fixture
def vendor(built: dict[str, Path]) -> Path:
    return built["vendor"]


@pytest.fixture
def host(tmp_path: Path, vendor: Path) -> Host:
    """A host root whose /usr/local/vgpu holds the vendor's libvgpu.so, as HAMi leaves it."""
    h = Host(tmp_path / "host")
    h.libdir.mkdir(parents=True)
    shutil.copy(vendor, h.live)
    return h


@pytest.fixture
def running(image: Image, host: Host, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Agent]:
    """An agent running in a thread (watch mode from the test's `watch` marker), stopped at the end."""
    marker = request.node.get_closest_marker("watch")
    watch, interval = marker.args if marker else ("inotify", 30.0)
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, interval=interval, watch=watch,
                              status_file=tmp_path / "run" / "agent.json", settle=0.05))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    wait_for(lambda: agent.snapshot().ready or agent.snapshot().state == "error")  # published: status file too
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(TIMEOUT)
        assert not thread.is_alive()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "watch(kind, interval): how the `running` agent fixture watches")
