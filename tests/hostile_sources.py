"""Stand-ins for a Prometheus or a dcgm-exporter that misbehave: they trickle a byte at a
time, stream without end, send garbage, pages too large, or answers whose series have odd
shapes. Each is a raw socket server on a loopback address (127.0.0.1, or 127.0.0.N for an
exporter per node, all on one port), bounded in count and time: at most `MAX_CONNECTIONS`
connections at once, none kept longer than `MAX_SECONDS`, all closed by `close()`.

Every connection is logged (`Connection`): when it opened, when it ended, how many bytes
the stand-in sent, and whether the client went away (the test's evidence that gpuops stopped
reading) or the stand-in stopped by itself. A `Behaviour` decides what a connection gets."""

from __future__ import annotations

import errno
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_CONNECTIONS = 64
MAX_SECONDS = 30.0
TICK = 0.02


class ClientGone(Exception):
    """The client closed its end: it stopped reading."""


class _Stopped(Exception):
    """The stand-in's own limit (or close()) ended the connection."""


@dataclass
class Connection:
    opened: float
    ended: float | None = None
    sent: int = 0
    by_client: bool = False  # the client went away (else the stand-in ended it)
    path: str = ""


class Wire:
    """What a behaviour writes to: sends that notice a client that went away."""

    def __init__(self, sock: socket.socket, log: Connection, stop: threading.Event) -> None:
        self.sock = sock
        self.log = log
        self.stop = stop

    def _check(self) -> None:
        if self.stop.is_set() or time.monotonic() - self.log.opened > MAX_SECONDS:
            raise _Stopped()
        readable, _, _ = select.select([self.sock], [], [], 0)
        if readable:
            try:
                if self.sock.recv(4096, socket.MSG_PEEK) == b"":
                    raise ClientGone()
                self.sock.recv(4096)  # more of the request (or junk): ignored
            except (ConnectionResetError, BrokenPipeError):
                raise ClientGone() from None

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._check()
            _, writable, _ = select.select([], [self.sock], [], TICK)
            if not writable:
                continue  # the client is not reading: wait, but see whether it left
            try:
                n = self.sock.send(view[:65536])
            except (BrokenPipeError, ConnectionResetError):
                raise ClientGone() from None
            self.log.sent += n
            view = view[n:]

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check()
            time.sleep(min(TICK, max(0.0, end - time.monotonic())))


Behaviour = Callable[[Wire, str], None]  # (the wire, the request's path)


def head(status: int = 200, *, length: int | None = None, kind: str = "application/json",
         extra: Iterable[str] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}", f"Content-Type: {kind}", "Connection: close",
             *([f"Content-Length: {length}"] if length is not None else []), *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(body: bytes, *, status: int = 200, kind: str = "application/json") -> Behaviour:
    def behave(wire: Wire, path: str) -> None:
        # (Sent apart: the stand-in copies nothing, so the memory a case takes is gpuops's.)
        wire.send(head(status, length=len(body), kind=kind))
        wire.send(body)
    return behave


def trickle(body: bytes, *, every: float = 0.05, kind: str = "application/json") -> Behaviour:
    """The whole answer, headers included, a byte at a time."""
    def behave(wire: Wire, path: str) -> None:
        for byte in head(length=len(body), kind=kind) + body:
            wire.send(bytes([byte]))
            wire.wait(every)
    return behave


def endless_headers(*, every: float = 0.05) -> Behaviour:
    """A status line, then header lines without end, one every `every`."""
    def behave(wire: Wire, path: str) -> None:
        wire.send(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while True:
            wire.send(f"X-Pad-{n % 50}: {'x' * 10}\r\n".encode())
            n += 1
            wire.wait(every)
    return behave


def endless(piece: bytes, *, start: bytes = b"", kind: str = "application/json", chunked: bool = False) -> Behaviour:
    """A body that never ends, as fast as the client reads it."""
    def behave(wire: Wire, path: str) -> None:
        extra = ("Transfer-Encoding: chunked",) if chunked else ()
        wire.send(head(kind=kind, extra=extra) + (_chunk(start) if chunked and start else start))
        block = _chunk(piece * 16) if chunked else piece * 16
        while True:
            wire.send(block)
    return behave


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def silent() -> Behaviour:
    """Reads the request, never answers."""
    def behave(wire: Wire, path: str) -> None:
        while True:
            wire.wait(1.0)
    return behave


def raw(data: bytes) -> Behaviour:
    """These bytes, whatever they are, then the connection closed."""
    def behave(wire: Wire, path: str) -> None:
        wire.send(data)
    return behave


def claims_length(length: int, body: bytes = b"{") -> Behaviour:
    """A Content-Length it never sends (huge, or longer than what follows), then silence."""
    def behave(wire: Wire, path: str) -> None:
        wire.send(head(length=length) + body)
        while True:
            wire.wait(1.0)
    return behave


def by_query(series: Behaviour, rates: Behaviour) -> Behaviour:
    """Prometheus's two queries answered differently (the rates query holds increase())."""
    def behave(wire: Wire, path: str) -> None:
        (rates if "increase" in path else series)(wire, path)
    return behave


def vector(result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


class StandIn:
    """One stand-in server per address (all on one port); `behave[address]` is what its
    connections get (change it between cases)."""

    def __init__(self, addresses: Iterable[str], behaviour: Behaviour) -> None:
        self.stop = threading.Event()
        self.behave: dict[str, Behaviour] = {}
        self.connections: list[Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.port = self._bind(list(addresses))
        for address in self.behave:
            self.behave[address] = behaviour
        for listener in self._listeners:
            thread = threading.Thread(target=self._accept, args=(listener,), daemon=True, name="stand-in-accept")
            thread.start()
            self._threads.append(thread)

    def _bind(self, addresses: list[str]) -> int:
        for _ in range(20):
            port = 0
            try:
                for address in addresses:
                    listener = socket.socket()
                    self._listeners.append(listener)
                    listener.bind((address, port))
                    listener.listen(MAX_CONNECTIONS)
                    listener.settimeout(TICK * 5)
                    port = port or listener.getsockname()[1]
                    self.behave[address] = silent()
                return port
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
                for listener in self._listeners:
                    listener.close()
                self._listeners.clear()
                self.behave.clear()
        raise RuntimeError("no port free on every stand-in address")

    def _accept(self, listener: socket.socket) -> None:
        address = listener.getsockname()[0]
        while not self.stop.is_set():
            try:
                sock, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                sock.close()  # over the bound: refused
                continue
            log = Connection(opened=time.monotonic())
            with self._lock:
                self.connections.append(log)
            thread = threading.Thread(target=self._serve, args=(sock, log, self.behave[address]), daemon=True,
                                      name="stand-in-conn")
            thread.start()

    def _serve(self, sock: socket.socket, log: Connection, behaviour: Behaviour) -> None:
        wire = Wire(sock, log, self.stop)
        try:
            sock.setblocking(True)
            log.path = self._request_path(sock)
            behaviour(wire, log.path)
            # Done sending: wait (bounded) for the client to close its end.
            wire.wait(MAX_SECONDS)
        except ClientGone:
            log.by_client = True
        except (_Stopped, OSError):
            pass
        finally:
            log.ended = time.monotonic()
            sock.close()
            self._slots.release()

    @staticmethod
    def _request_path(sock: socket.socket) -> str:
        sock.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            piece = sock.recv(4096)
            if not piece:
                raise ClientGone()
            data += piece
        sock.settimeout(None)
        first = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        return first[1] if len(first) > 1 else ""

    def open_connections(self) -> list[Connection]:
        with self._lock:
            return [c for c in self.connections if c.ended is None]

    def close(self) -> None:
        self.stop.set()
        for listener in self._listeners:
            listener.close()
        deadline = time.monotonic() + 5
        while self.open_connections() and time.monotonic() < deadline:
            time.sleep(TICK)

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
