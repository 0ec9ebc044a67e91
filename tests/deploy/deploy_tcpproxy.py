"""A tiny TCP proxy the tests control: forwards 127.0.0.1:<port> to a server and can cut the link
after N bytes from the client (to break an SSH connection in the middle of an upload)."""
from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    def __init__(self, target_port: int, cut_after: int | None = None, *, once: bool = False) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.once = once  # cut only the first connection: later ones (a re-dial) pass
        self.sent = 0
        self.cut = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            if self.once and self.cut.is_set():
                self.cut_after = None  # the cut happened: this is a re-dial, let it through
            self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    self.sent += len(data)
                    recut = self.once and self.cut.is_set()
                    if self.cut_after is not None and self.sent > self.cut_after and not recut:
                        self.cut.set()
                        self.close_all()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close_all(self) -> None:
        for s in self._conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def stop(self) -> None:
        self.listener.close()
        self.close_all()
