"""A bounded HTTP GET server for the agent's probes and metrics: one thread, one epoll, no thread per client.

Nothing a client does may cost the agent more than a fixed share of its descriptors, threads or time:
- at most `max_conns` connections are open (fewer when RLIMIT_NOFILE is low: a quarter of it). A client
  reaches accept() with its request (TCP_DEFER_ACCEPT, on Linux; a silent one only after `header_timeout`),
  and a request already whole is answered as it is accepted. A new connection over the cap first has every
  request that arrived whole answered, then closes the oldest connection that has sent nothing (else the
  oldest with an unfinished request): a flood of idle clients cannot lock out a probe, which sends its whole
  request at once;
- a request must arrive whole (request line and headers, at most `max_request` bytes) within
  `header_timeout` seconds of the connection, and its answer must drain within `write_timeout`;
- every answer closes its connection (`Connection: close`): no keep-alive state to hold;
- descriptors are watched through `selectors` (epoll or poll), never select(), so a descriptor number
  above 1024 is harmless; running out of descriptors pauses accepting briefly instead of spinning.
A failure in the answer callback is a 500 for that request, never the end of the server.
"""
from __future__ import annotations

import contextlib
import errno
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Callable

Answer = tuple[int, str, str]  # HTTP code, content type, body
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_PAUSE = 0.1  # seconds without accepting after running out of descriptors


def fd_cap(max_conns: int) -> int:
    """`max_conns`, lowered to a quarter of the soft RLIMIT_NOFILE: the rest stays for repairs and the API."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_conns
    return max(2, min(max_conns, soft // 4))


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None  # the answer still to send, once the request is read


class BoundedServer:
    """Serves GET/HEAD through `answer(path) -> (code, content type, body)` from a daemon thread."""

    def __init__(self, addr: str, port: int, answer: Callable[[str], Answer], *, max_conns: int = 64,
                 header_timeout: float = 5.0, write_timeout: float = 5.0, max_request: int = 8192,
                 name: str = "vgpu-agent-http") -> None:
        self.answer = answer
        self.max_conns = fd_cap(max_conns)
        self.header_timeout, self.write_timeout, self.max_request = header_timeout, write_timeout, max_request
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        # a deep accept queue: under a flood a probe waits there (its request already sent) rather than have
        # its connection refused; the kernel caps it at net.core.somaxconn
        self._sock = socket.create_server((addr, port), family=family, backlog=1024)
        if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux: a client reaches accept() with its request (or after
            # header_timeout): a silent one takes no slot meanwhile, and a probe is answered as it is accepted
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, round(header_timeout)))
        self._sock.setblocking(False)
        self.server_address = self._sock.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}  # by fd, oldest first
        self._paused_until = 0.0
        self._stop = False
        self.served = self.evicted = self.timed_out = 0  # counters for tests and logs
        self._thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)

    def start(self) -> BoundedServer:
        self._thread.start()
        return self

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # -- the loop ---------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        while not self._stop:
            try:
                self._turn()
            except Exception:  # a bug here must not end the probes: drop every client and go on
                for fd in list(self._conns):
                    self._close(fd)
                time.sleep(_PAUSE)
        self._cleanup()

    def _turn(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        wake_at = min([c.deadline for c in self._conns.values()] + ([self._paused_until] if self._paused_until
                                                                    else []), default=now + 60.0)
        for key, mask in self._sel.select(max(0.0, wake_at - now)):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif key.fd in self._conns:
                if mask & selectors.EVENT_READ:
                    self._read(key.fd)
                elif mask & selectors.EVENT_WRITE:
                    self._write(key.fd)
        now = time.monotonic()
        for fd in [fd for fd, c in self._conns.items() if c.deadline <= now]:
            self.timed_out += 1
            self._close(fd)

    def _accept(self) -> None:
        for _ in range(64):  # then let reads and deadlines have a turn
            try:
                sock, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno == errno.ECONNABORTED:
                    continue
                if e.errno in _OUT_OF_FDS:
                    if self._conns:  # make room; the pending client is accepted on the next turn
                        self._make_room()
                    else:
                        self._sel.unregister(self._sock)
                        self._paused_until = time.monotonic() + _PAUSE
                    return
                raise
            if len(self._conns) >= self.max_conns:
                self._make_room()
            sock.setblocking(False)
            self._conns[sock.fileno()] = _Conn(sock, time.monotonic() + self.header_timeout)
            self._sel.register(sock, selectors.EVENT_READ)
            self._read(sock.fileno())  # a probe's request is usually here already: answered before any eviction

    def _make_room(self) -> None:
        """One connection fewer: first read every connection with data waiting (a probe sends its whole request at
        once, and its answer closes it; a client gone is closed), and only if that frees nothing close the oldest
        connection that has sent nothing, else the oldest still reading its request, else the oldest."""
        for key, mask in self._sel.select(0):  # what is ready now: one epoll_wait, no read of an idle client
            if key.fd in self._conns and self._conns[key.fd].out is None and mask & selectors.EVENT_READ:
                self._read(key.fd)
        if len(self._conns) < self.max_conns:
            return
        conns = self._conns.items()
        victim = next((fd for fd, c in conns if c.out is None and not c.inbuf), None)
        if victim is None:
            victim = next((fd for fd, c in conns if c.out is None), next(iter(self._conns)))
        self._close(victim)
        self.evicted += 1

    def _read(self, fd: int) -> None:
        c = self._conns[fd]
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(fd)
            return
        c.inbuf += data
        end = c.inbuf.find(b"\r\n\r\n")
        if end < 0:
            end = c.inbuf.find(b"\n\n")
        if end < 0:
            if len(c.inbuf) > self.max_request:
                self._respond(fd, (431, "text/plain; charset=utf-8", "request header fields too large\n"))
            return
        self._respond(fd, *self._handle(bytes(c.inbuf[:end])))

    def _handle(self, head: bytes) -> tuple[Answer, bool]:
        """(answer, whether to send its body) for one request head."""
        parts = head.split(b"\r\n" if b"\r\n" in head else b"\n", 1)[0].split()
        text = "text/plain; charset=utf-8"
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return (400, text, "bad request\n"), True
        method, target = parts[0], parts[1].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            return (405, text, "only GET and HEAD\n"), True
        try:
            res = self.answer(target.split("?", 1)[0])
        except Exception as e:  # the answer's bug is this request's 500, not the server's end
            res = (500, text, f"internal error: {type(e).__name__}\n")
        return res, method == b"GET"

    def _respond(self, fd: int, res: Answer, with_body: bool = True) -> None:
        c = self._conns[fd]
        code, ctype, body = res
        data = body.encode()
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = ""
        head = (f"HTTP/1.1 {code} {phrase}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n").encode()
        c.out = memoryview(head + (data if with_body else b""))
        c.deadline = time.monotonic() + self.write_timeout
        self.served += 1
        self._sel.modify(c.sock, selectors.EVENT_WRITE)
        self._write(fd)

    def _write(self, fd: int) -> None:
        c = self._conns[fd]
        if c.out is None:  # an event of an earlier connection on this descriptor number, closed since
            return
        try:
            sent = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(fd)
            return
        c.out = c.out[sent:]
        if not c.out:
            self._close(fd)

    def _close(self, fd: int) -> None:
        c = self._conns.pop(fd)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(c.sock)
        with contextlib.suppress(OSError):
            c.sock.close()

    # -- stopping ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop serving, close every connection and the listening socket (waits for the thread)."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(10)
        else:
            self._cleanup()

    def _cleanup(self) -> None:
        for fd in list(self._conns):
            self._close(fd)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
