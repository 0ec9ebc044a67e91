"""Nothing on the network can stop the agent: slow and idle clients, floods, few descriptors, failing checks.

The server (vgpu_patch/agent/httpd.py) is bounded in connections, time per request and threads; the watch
loop survives any exception in a check. Every test holds a time limit and closes what it opened.
"""
from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_helpers import TIMEOUT, Host, Image, hami_copy_back, sha, wait_for

from vgpu_patch.agent import Agent, AgentConfig
from vgpu_patch.agent.httpd import BoundedServer
from vgpu_patch.commands.agent import default_metrics_addr
from vgpu_patch.report.errors import DeployError

HOSTILE = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Open: "  # one header that never ends
REPO = Path(__file__).resolve().parents[2]


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out


@contextlib.contextmanager
def server(**kw: float) -> Iterator[BoundedServer]:
    def answer(path: str) -> tuple[int, str, str]:
        if path == "/boom":
            raise RuntimeError("a bug in the answer")
        return 200, "text/plain", f"ok {path}\n"

    srv = BoundedServer("127.0.0.1", 0, answer, **kw).start()  # type: ignore[arg-type]
    try:
        yield srv
    finally:
        srv.shutdown()


@contextlib.contextmanager
def nofile(at_least: int) -> Iterator[None]:
    """Raise this process's soft RLIMIT_NOFILE for the test (skip when the hard limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < at_least:
        pytest.skip(f"needs RLIMIT_NOFILE >= {at_least} (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, at_least), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def flood(port: int, n: int, sample: Callable[[], None] | None = None, limit: float = 120.0) -> list[socket.socket]:
    """Open `n` connections that each send an unfinished request and then idle; the caller closes them."""
    held: list[socket.socket] = []
    start = time.monotonic()
    for i in range(n):
        if time.monotonic() - start > limit:
            for s in held:
                s.close()
            raise AssertionError(f"only {i} of {n} connections opened within {limit:g}s")
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(HOSTILE)
        except OSError:  # the server may already have dropped it: a hostile client does not care
            pass
        held.append(s)
        if sample is not None and i % 250 == 0:
            sample()
    return held


def closed_by_peer(s: socket.socket, limit: float) -> float | None:
    """Seconds until the server closes `s` while it drips one header byte every 0.1 s; None if it never does."""
    start = time.monotonic()
    s.settimeout(0.1)
    while time.monotonic() - start < limit:
        try:
            s.sendall(b"x")
            if s.recv(1) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


# -- the server alone --------------------------------------------------------------------------------
def test_a_slow_client_is_cut_at_its_header_deadline_and_delays_no_one() -> None:
    with server(header_timeout=1.0) as srv, socket.create_connection(srv.server_address, timeout=5) as slow:
        port = srv.server_address[1]
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.monotonic()
        assert get(port, "/healthz") == (200, "ok /healthz\n")
        assert time.monotonic() - t0 < 1.0  # answered while the slow client still holds its connection
        took = closed_by_peer(slow, 5.0)  # dripping bytes does not extend the deadline
        assert took is not None and took < 3.0
        assert srv.timed_out == 1 and srv.open_connections == 0


def test_oversized_odd_and_failing_requests_are_answered_and_closed() -> None:
    with server(header_timeout=5.0) as srv:
        port = srv.server_address[1]
        assert raw(port, b"GET / HTTP/1.1\r\nX: " + b"a" * 10000).startswith(b"HTTP/1.1 431 ")
        assert raw(port, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        assert raw(port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        head = raw(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        assert get(port, "/boom")[0] == 500
        assert get(port, "/healthz") == (200, "ok /healthz\n")
        wait_for(lambda: srv.open_connections == 0, 5)


def test_the_connection_cap_closes_the_oldest_and_follows_rlimit_nofile() -> None:
    with server(max_conns=8, header_timeout=30.0) as srv:
        port = srv.server_address[1]
        held = flood(port, 50)
        try:
            wait_for(lambda: srv.evicted >= 42, 10)
            assert srv.open_connections <= 8
            assert get(port, "/healthz") == (200, "ok /healthz\n")
        finally:
            for s in held:
                s.close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
    try:
        with server(max_conns=64) as srv:
            assert srv.max_conns == 10  # a quarter of the descriptors, whatever was asked
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_default_bind_is_the_pod_ip_a_pod_or_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_IP", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert default_metrics_addr() == "127.0.0.1"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert default_metrics_addr() == "0.0.0.0"
    monkeypatch.setenv("POD_IP", "10.244.3.7")
    assert default_metrics_addr() == "10.244.3.7"


# -- descriptors above 1024 -------------------------------------------------------------------------------
def test_watcher_and_node_script_stream_work_with_descriptors_above_1024(tmp_path: Path) -> None:
    """select() raises ValueError for a descriptor >= 1024; a busy agent's fresh descriptors are numbered so."""
    from vgpu_patch.agent.watcher import InotifyWatcher
    from vgpu_patch.transport.local import LocalTransport

    with nofile(2048):
        filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        try:
            watcher = InotifyWatcher(tmp_path)
            try:
                assert watcher.fd > 1024
                (tmp_path / "libvgpu.so").write_bytes(b"x")
                assert watcher.wait(5.0) is True
                watcher.wake()
                assert watcher.wait(5.0) is False
            finally:
                watcher.close()
            stream = LocalTransport().open_stream("echo hello; echo READY; cat", timeout=5.0)
            assert stream is not None
            assert stream.read_until("READY") == "hello\nREADY\n"
            stream.send(b"ping\n")
            res = stream.finish()
            assert res.ok and res.stdout == "ping\n"
        finally:
            for fd in filler:
                os.close(fd)


# -- the loop ----------------------------------------------------------------------------------------------
def test_any_exception_in_a_check_is_one_line_and_retried_with_backoff(image: Image, host: Host, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capfd: pytest.CaptureFixture[str]) -> None:
    real, calls = Agent.ensure, []

    def flaky(self: Agent, *, startup: bool) -> str:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(self, startup=startup)

    monkeypatch.setattr(Agent, "ensure", flaky)
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, interval=30.0, watch="poll",
                              status_file=tmp_path / "agent.json", proc=None))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: agent.snapshot().ready, 15)  # retried after 0.5 s and 1 s and 2 s, not the 30 s interval
        assert thread.is_alive() and agent.snapshot().errors == 3 and sha(host.live) == image.sha256
        gaps = [b - a for a, b in zip(calls, calls[1:])]
        assert gaps[0] >= 0.4 and gaps[1] >= 0.9 and gaps[1] > gaps[0]
    finally:
        agent.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    err = capfd.readouterr().err
    assert err.count("unexpected OSError") == 1, err  # the same failure is logged once, counted every time


def test_a_broken_watch_falls_back_to_polling_and_still_repairs(image: Image, host: Host, vendor: Path,
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    from vgpu_patch.agent.watcher import InotifyWatcher

    def broken(self: InotifyWatcher, timeout: float) -> bool:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(InotifyWatcher, "wait", broken)
    agent = Agent(AgentConfig(library=image.library, host_root=host.root, interval=0.2, watch="inotify",
                              status_file=tmp_path / "agent.json", proc=None, settle=0.05))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: agent.snapshot().ready and agent.snapshot().watch == "poll")
        hami_copy_back(vendor, host.live)
        wait_for(lambda: sha(host.live) == image.sha256 and agent.snapshot().reapplies == 1)
        assert thread.is_alive()
    finally:
        agent.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert capfd.readouterr().err.count("polling instead") == 1


def test_once_turns_an_unexpected_exception_into_one_error(image: Image, host: Host,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Agent, *, startup: bool) -> str:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(Agent, "ensure", broken)
    with pytest.raises(DeployError, match="unexpected BlockingIOError"):
        Agent(AgentConfig(library=image.library, host_root=host.root, proc=None)).run(once=True)


# -- the real command under attack -----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def real_agent(image: Image, host: Host, tmp_path: Path, nofile_limit: int | None = None) -> Iterator[tuple]:
    port = free_port()

    def limit() -> None:
        if nofile_limit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_limit, nofile_limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_patch.cli", "agent", "--library", str(image.library), "--host-root",
         str(host.root), "--interval", "30", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1",
         "--status-file", str(tmp_path / "agent.json"), "--no-stale-scan"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, preexec_fn=limit,
    )
    try:
        wait_for(lambda: proc.poll() is not None or get_or_none(port, "/healthz") == 200)
        assert proc.poll() is None, proc.communicate(timeout=TIMEOUT)[1]
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def get_or_none(port: int, path: str) -> int | None:
    try:
        return get(port, path, timeout=2)[0]
    except OSError:
        return None


def usage(pid: int) -> tuple[int, int]:
    """(open descriptors, threads) of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return fds, threads


def survives(proc: subprocess.Popen, port: int, host: Host, image: Image, vendor: Path, held: list,
             baseline: int) -> None:
    """With the hostile connections still open: probes answer, metrics render, a copy-back is repaired;
    once they close, the agent is back to the descriptors it held before the flood."""
    assert proc.poll() is None
    assert get(port, "/healthz") == (200, "ready\n")
    assert "\nvgpu_patch_agent_ready 1\n" in get(port, "/metrics")[1]
    hami_copy_back(vendor, host.live)
    wait_for(lambda: sha(host.live) == image.sha256
             and "\nvgpu_patch_agent_reapplies_total 1\n" in get(port, "/metrics")[1])
    assert get(port, "/livez") == (200, "alive\n")
    for s in held:
        s.close()
    wait_for(lambda: usage(proc.pid)[0] <= baseline, 15)  # the server's side is closed too (EOF or deadline)
    assert proc.poll() is None


def test_5000_idle_connections_leave_the_agent_healthy_and_bounded(image: Image, host: Host, vendor: Path,
                                                                    tmp_path: Path) -> None:
    with nofile(6000), real_agent(image, host, tmp_path) as (proc, port):
        baseline, peak = usage(proc.pid)[0], [0, 0]

        def sample() -> None:
            fds, threads = usage(proc.pid)
            peak[0], peak[1] = max(peak[0], fds), max(peak[1], threads)

        held = flood(port, 5000, sample, limit=120.0)
        try:
            sample()
            assert peak[0] <= 64 + 40, f"the agent held {peak[0]} descriptors"  # the cap plus its own files
            assert peak[1] <= 4, f"the agent ran {peak[1]} threads"  # no thread per client: a pids limit holds
            survives(proc, port, host, image, vendor, held, baseline)
        finally:
            for s in held:
                s.close()


def test_with_64_descriptors_the_agent_still_answers_and_repairs(image: Image, host: Host, vendor: Path,
                                                                  tmp_path: Path) -> None:
    with real_agent(image, host, tmp_path, nofile_limit=64) as (proc, port):
        baseline = usage(proc.pid)[0]
        held = flood(port, 1000)
        try:
            assert usage(proc.pid)[0] <= 64
            survives(proc, port, host, image, vendor, held, baseline)
        finally:
            for s in held:
                s.close()


# a flooder process: opens connections as fast as it can, each idle (silent, or an unfinished request), keeps the
# newest 400 open, until killed
FLOODER = """
import socket, sys
port, hello, window = int(sys.argv[1]), sys.argv[2].encode(), []
while True:
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        continue
    if hello:
        try:
            s.send(hello)
        except OSError:
            pass
    window.append(s)
    if len(window) > 400:
        window.pop(0).close()
"""


@pytest.mark.parametrize("hello", [b"", HOSTILE], ids=["sends-nothing", "unfinished-request"])
def test_health_probes_are_answered_during_an_idle_connection_flood(image: Image, host: Host, tmp_path: Path,
                                                                    hello: bytes) -> None:
    """A flooder process keeps the agent's connection cap full of idle clients (thousands a second); meanwhile 200
    probes, each on a fresh connection, are all answered: a client reaches the server with its request (a probe
    sends it at once) and is answered as it is accepted; before it evicts anyone the server answers every
    request that has arrived whole, and it evicts the clients that sent nothing first."""
    with real_agent(image, host, tmp_path) as (proc, port):
        flooders = [subprocess.Popen([sys.executable, "-c", FLOODER, str(port), hello.decode()],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        failed: list[tuple[int, str]] = []
        try:
            time.sleep(1.0)  # the flood is on
            assert all(f.poll() is None for f in flooders)
            start = time.monotonic()
            for i in range(200):
                try:
                    code, body = get(port, "/healthz", timeout=5)
                    if code != 200:
                        failed.append((i, f"{code} {body.strip()}"))
                except OSError as e:
                    failed.append((i, repr(e)))
                assert time.monotonic() - start < 150, f"200 probes took too long ({len(failed)} failed so far)"
        finally:
            for f in flooders:
                f.kill()
                f.wait(10)
        assert failed == [], f"{len(failed)} of 200 probes failed during the flood: {failed[:3]}"
        assert proc.poll() is None
