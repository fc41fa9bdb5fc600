"""One GET read whole within one deadline and a size cap, whatever the other end does.

A socket timeout bounds each read, not the answer: a server that sends a byte a second
(headers or body) never trips it, and one that streams without end is read into memory
until the process dies. Here the deadline covers the whole answer (connect, TLS, headers,
body, redirects): a watch shuts the connection's sockets down when it passes, which wakes
any read blocked on them, so no thread keeps reading past it; and the body is read in
pieces, refused as soon as it would pass `max_bytes` (or its Content-Length says so).

Everything else is urllib's, as before: proxies from the environment, redirects, TLS with
the given context. Only the name lookup is not bounded (the resolver cannot be woken)."""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

_PIECE = 64 * 1024
# The most of an error answer's body that is read (for the reason Prometheus gives).
ERROR_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Deadline:
    """An instant on the monotonic clock by which an answer must be in."""

    at: float

    @classmethod
    def within(cls, seconds: float, *, now: float | None = None) -> Deadline:
        return cls((time.monotonic() if now is None else now) + seconds)

    def remaining(self, *, now: float | None = None) -> float:
        return self.at - (time.monotonic() if now is None else now)

    def earlier(self, other: Deadline | None) -> Deadline:
        return self if other is None or self.at <= other.at else other


class DeadlinePassed(Exception):
    """The answer was not in (whole) by the deadline."""


class AnswerTooLarge(Exception):
    """The answer is longer than the most that is read."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"more than {max_bytes} bytes")
        self.max_bytes = max_bytes


class Refused(Exception):
    """An HTTP answer other than 2xx; `body` is its first `ERROR_BODY_BYTES` at most."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class _Readable(Protocol):
    def read(self, amt: int, /) -> bytes: ...


class _Watch:
    """Shuts down every socket an answer opened once the deadline passes. It keeps its
    own duplicate of each (a TLS wrapper takes the original's descriptor over), and a
    shutdown reaches the connection whichever descriptor holds it."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.fired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(max(0.0, deadline.remaining()), self._fire)
        self._timer.name = "gpuops-answer-deadline"
        self._timer.daemon = True
        self._timer.start()

    def connect(self, address: tuple[str, int], timeout: object = None,
                source_address: tuple[str, int] | None = None) -> socket.socket:
        """`socket.create_connection` bounded by the deadline (http.client's hook)."""
        remaining = self.deadline.remaining()
        if remaining <= 0:
            raise DeadlinePassed()
        sock = socket.create_connection(address, remaining, source_address)
        with self._lock:
            if self.fired:
                sock.close()
                raise DeadlinePassed()
            self._sockets.append(sock.dup())
        return sock

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the other end

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = watch.connect


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = watch.connect


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPConnection, watch=self._watch), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch, context: Any) -> None:
        super().__init__(context=context)
        self._watch = watch
        self._tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPSConnection, watch=self._watch), req, context=self._tls)


def _read(answer: _Readable, *, max_bytes: int, cut: bool = False) -> bytes:
    """The body, in pieces; past `max_bytes`, AnswerTooLarge (or, with `cut`, its start)."""
    pieces: list[bytes] = []
    size = 0
    while True:
        piece = answer.read(min(_PIECE, max_bytes + 1 - size))
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > max_bytes:
            if cut:
                return b"".join(pieces) + piece[:max_bytes - size]
            raise AnswerTooLarge(max_bytes)
        pieces.append(piece)


def get_bytes(url: str, *, headers: Mapping[str, str], context: Any, deadline: Deadline, max_bytes: int) -> bytes:
    """The body of a GET of `url`, read whole by `deadline` and at most `max_bytes` long.

    Raises DeadlinePassed, AnswerTooLarge, Refused (an HTTP error status), or what urllib
    and http.client raise for a connection that failed or an answer that is not HTTP
    (`urllib.error.URLError`, `OSError`, `http.client.HTTPException`). Returns only once
    no socket of the answer is open."""
    if deadline.remaining() <= 0:
        raise DeadlinePassed()
    watch = _Watch(deadline)
    opener = urllib.request.build_opener(_HTTPHandler(watch), _HTTPSHandler(watch, context))
    request = urllib.request.Request(url, headers=dict(headers), method="GET")
    try:
        try:
            with opener.open(request, timeout=max(deadline.remaining(), 0.001)) as answer:
                length = answer.headers.get("Content-Length")
                if length is not None and length.strip().isdigit() and int(length) > max_bytes:
                    raise AnswerTooLarge(max_bytes)
                body = _read(answer, max_bytes=max_bytes)
        except urllib.error.HTTPError as err:
            with err:
                detail = _read(err, max_bytes=ERROR_BODY_BYTES, cut=True) if err.fp is not None else b""
            raise Refused(err.code, str(err.reason), detail) from None
    except AnswerTooLarge:
        raise
    except (OSError, http.client.HTTPException, ValueError, DeadlinePassed):
        # A read the watch woke ends in whatever error the socket gave (or a short body).
        if watch.fired or deadline.remaining() <= 0:
            raise DeadlinePassed() from None
        raise
    finally:
        watch.close()
    if watch.fired:
        raise DeadlinePassed()  # the body ended because the watch shut the socket down
    return body
