"""Slow clients for the HTTP servers' tests: connections that drip a request's headers
and never end them, on 127.0.0.1 only, bounded in count and time."""

from __future__ import annotations

import select
import socket
import threading
import time


class Drips(threading.Thread):
    """`count` connections to `address`, each sending `GET /` and then header bytes one
    every `every` seconds without ever ending them; a connection the server closes is
    opened again. Runs until `stop()` or `seconds` have passed, then closes them all."""

    def __init__(self, address: tuple[str, int], *, count: int, every: float, seconds: float) -> None:
        super().__init__(daemon=True, name=f"drips-{address[1]}")
        assert address[0] == "127.0.0.1"  # attack traffic stays on this machine
        self._address, self._every = address, every
        self._until = time.monotonic() + seconds
        self._done = threading.Event()
        self.opened = 0
        self.socks: list[socket.socket] = [self._open() for _ in range(count)]

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=10)
        sock.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")
        sock.setblocking(False)
        self.opened += 1
        return sock

    def run(self) -> None:
        try:
            while not self._done.wait(self._every) and time.monotonic() < self._until:
                closed = self._closed_by_server()
                for i, sock in enumerate(self.socks):
                    try:
                        if sock.fileno() in closed:
                            raise ConnectionResetError
                        sock.send(b"a")
                    except OSError:
                        sock.close()
                        self.socks[i] = self._open()
        finally:
            for sock in self.socks:
                sock.close()

    def _closed_by_server(self) -> set[int]:
        poll = select.poll()
        for sock in self.socks:
            poll.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        return {fd for fd, _ in poll.poll(0)}  # a server only ever closes these: they asked nothing

    def stop(self) -> None:
        self._done.set()
        self.join(30)
