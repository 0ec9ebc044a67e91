"""Top-level pytest configuration: the `gpu` marker runs only with --gpu (never in CI), the builds every
folder shares (the shim, the fake driver), each made once per test session, and one temporary directory per
run (pytest's basetemp and $TMPDIR under it) removed when the session ends (tests/tmp_guard.py)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import tmp_guard

FAKE_SRC = Path(__file__).resolve().parent / "fake_driver"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu", action="store_true", help="run tests that need a real NVIDIA GPU")


def pytest_configure(config: pytest.Config) -> None:
    """Without --basetemp, everything the run writes to a temporary place goes under one directory of its own:
    pytest's basetemp (not /tmp/pytest-of-USER, which pytest keeps) and $TMPDIR for the tests and every process
    they start. VGPU_TEST_TMP_CHECK=1 (.ci/run sets it) also fails the run when anything else appears in /tmp
    or the shim's default region is touched; runs nested in this one do not check again."""
    config.stash[_CHECK] = None
    if os.environ.pop("VGPU_TEST_TMP_CHECK", "") == "1":
        config.stash[_CHECK] = tmp_guard.snapshot()
    config.stash[_RUN_DIR] = None
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return
    run_dir = tmp_guard.make_run_dir()
    config.stash[_RUN_DIR] = run_dir
    # as /tmp is: other users reach it (sshd reads the harness's authorized_keys as the login user), and the
    # sticky bit keeps their files their own
    run_dir.chmod(0o755)
    (run_dir / "tmp").mkdir()
    (run_dir / "tmp").chmod(0o1777)
    config.option.basetemp = str(run_dir / "bt")
    os.environ["TMPDIR"] = tempfile.tempdir = str(run_dir / "tmp")


@pytest.hookimpl(trylast=True)  # after the session's fixtures (the sshd servers, the builds) are torn down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run_dir = session.config.stash.get(_RUN_DIR, None)
    if run_dir is not None and not os.environ.get("VGPU_TEST_KEEP_TMP"):
        tmp_guard.remove_run_dir(run_dir)
    before = session.config.stash.get(_CHECK, None)
    if before is None:
        return
    left = tmp_guard.left_behind(before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"the tests left {len(left)} thing(s) in /tmp: {', '.join(left)}; a test must write under "
                "tmp_path or $TMPDIR and never to the shim's default region")
        if reporter is not None:
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_RUN_DIR = pytest.StashKey["Path | None"]()
_CHECK = pytest.StashKey["tmp_guard.Snapshot | None"]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="needs a real GPU: run with --gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def build_fake_driver(out: Path, events: bool = False) -> Path:
    """tests/fake_driver/*.c -> out/libcuda.so.1 + out/libnvidia-ml.so.1 (SONAMEs set). `events`: with
    fake_events.c, whose kernels take time (FAKE_KERNEL_US) on one GPU the processes naming FAKE_GPU share."""
    from vgpu_patch.shim_build.build import header_dir

    out.mkdir(parents=True, exist_ok=True)
    common = ["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror",
              f"-I{header_dir()}", "-Wl,-Bsymbolic"]
    cuda = ["fake_cuda.c", "fake_events.c"] if events else ["fake_cuda.c"]
    for srcs, soname in ((cuda, "libcuda.so.1"), (["fake_nvml.c"], "libnvidia-ml.so.1")):
        subprocess.run(common + [f"-Wl,-soname,{soname}", *(str(FAKE_SRC / s) for s in srcs), "-o", str(out / soname),
                                 "-lpthread"], check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake CUDA driver and NVML (tests/fake_driver), built once for every folder."""
    return build_fake_driver(tmp_path_factory.mktemp("fake-driver"))


@pytest.fixture(scope="session")
def fake_gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake driver with a simulated GPU (fake_events.c, sim_gpu.h): kernels take FAKE_KERNEL_US on one GPU that
    every process naming the same FAKE_GPU file shares and time-slices; built once for every folder."""
    return build_fake_driver(tmp_path_factory.mktemp("fake-gpu"), events=True)


@pytest.fixture(scope="session")
def shim_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real shim, built once for every folder (or VGPU_TEST_SHIM: another build, e.g. zig or a floor)."""
    prebuilt = os.environ.get("VGPU_TEST_SHIM")
    if prebuilt:
        return Path(prebuilt).resolve()
    from vgpu_patch.shim_build.build import build_shim

    # native gcc, no glibc floor: the fastest build; floors and zig are the build tests' business
    return build_shim(tmp_path_factory.mktemp("shim"), compiler="gcc", glibc=None).library
