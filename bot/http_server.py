"""HTTP mode: the Bolt app behind waitress, a kept production WSGI server.

Slack POSTs slash commands, clicks and events to `/slack/events`; `/healthz` answers 200
for a liveness probe on the same server. Put it behind the cluster's TLS ingress; Slack
only calls HTTPS URLs.

What waitress does for us (its settings, from `HttpSettings`): it reads every request
whole on its event loop before a worker thread sees it, so a slow or silent client
holds no thread; it drops a connection idle for `read_timeout` seconds (a client that
announces a body and sends nothing); it stops accepting past `max_connections` open
connections (the rest wait in the listen `backlog`, which is large, so a burst is
queued, not reset); it refuses bodies over `max_body` with 413, and it reads
`Transfer-Encoding: chunked` bodies itself.

What waitress does not do, and `_SlowClientGuard` does on the same event loop: waitress
bounds only idle time, so a client that drips a header byte every few seconds is never
idle and keeps its connection for ever; a few hundred of them take every connection and
Slack's own requests wait in the backlog past Slack's 3 s. So every request must arrive
whole (headers and body) within `request_deadline` seconds of its first byte, or its
connection is closed; and when every connection is taken while another waits to be
accepted, the one that has waited longest for a whole request (at least
`make_room_after` seconds) is closed to make room. A connection whose request is being
answered is never closed for either. What it closed is said in one line a minute at
most, while it happens.

What gpuops does before Bolt sees a request (`SlackEndpoint`): it checks the signature
and timestamp over the raw bytes, and only then decodes and parses the body. A request
that fails gets 401 (signature) or 400 (a signed body that is not a Slack payload) and
one log line that names the reason and the client, never the body. Bolt checks the
signature again (its own middleware), so an app dispatched some other way is still
guarded.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import select
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self, cast

from slack_bolt import App, BoltRequest, BoltResponse
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_bolt.adapter.wsgi.http_request import WsgiHttpRequest
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import create_server

from bot import messages as msg

log = logging.getLogger("gpuops.bot.http")

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
# Slack refuses requests signed more than five minutes away from now.
MAX_CLOCK_SKEW = 300
# waitress counts its own listening socket and its wake-up pipe among the open ones.
_WAITRESS_OWN_SOCKETS = 2

# WSGI's start_response, as an application is handed it.
StartResponse = Callable[..., Any]


@dataclass(frozen=True)
class HttpSettings:
    """How the HTTP server protects itself: waitress's settings, then the slow-client guard's."""

    # Connections the kernel queues while every slot is taken (Linux caps it at
    # net.core.somaxconn); Python's http.server default of 5 reset bursts.
    backlog: int = 1024
    # Seconds a connection may send nothing before it is closed (whole seconds: waitress).
    read_timeout: int = 10
    # Open connections at most; past it new ones wait in the backlog.
    max_connections: int = 200
    # Worker threads running the ack (the work itself runs on Bolt's listener pool).
    threads: int = 8
    # Nothing Slack sends comes near this.
    max_body: int = 1 << 20
    # Seconds from a request's first byte until its headers and body are in; past it the
    # connection is closed (Slack gives up on an answer after 3 s anyway).
    request_deadline: float = 5.0
    # With every connection taken and another waiting to be accepted, the connection that
    # has waited longest for a whole request is closed once it has waited this long.
    make_room_after: float = 0.5
    # Seconds between two log lines about the slow clients closed (none while there are none).
    report_every: float = 60.0

    def __post_init__(self) -> None:
        for name in ("backlog", "read_timeout", "max_connections", "threads", "max_body"):
            if getattr(self, name) < 1:
                raise ValueError(f"HttpSettings.{name} must be at least 1, not {getattr(self, name)}")
        for name in ("request_deadline", "make_room_after", "report_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HttpSettings.{name} must be more than 0, not {getattr(self, name)}")


def signature_problem(*, secret: str, body: bytes, timestamp: str | None, signature: str | None,
                      now: float) -> str | None:
    """Why the request is not signed by Slack with `secret`, or None when it is.

    Done here over the raw bytes, not with slack_sdk's SignatureVerifier, because that one
    raises on a non-numeric timestamp or a non-ASCII signature and decodes the body before
    it checks anything."""
    if not timestamp or not signature:
        return msg.http_unsigned()
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        return msg.http_bad_timestamp()
    skew = abs(now - int(timestamp))
    if skew > MAX_CLOCK_SKEW:
        return msg.http_stale_timestamp(int(skew), MAX_CLOCK_SKEW)
    base = b"v0:" + timestamp.encode("ascii") + b":" + body
    expected = "v0=" + hmac.new(secret.encode("utf-8"), base, hashlib.sha256).hexdigest()
    if not signature.isascii() or not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii")):
        return msg.http_bad_signature()
    return None


class SlackEndpoint(SlackRequestHandler):
    """Bolt's WSGI adapter with the signature checked before the body is parsed."""

    def __init__(self, app: App, *, signing_secret: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(app, path=EVENTS_PATH)
        self._secret = signing_secret
        self._clock = clock

    def dispatch(self, request: WsgiHttpRequest) -> BoltResponse:
        environ = request.environ
        client = str(environ.get("REMOTE_ADDR") or "unknown")
        length = int(environ.get("CONTENT_LENGTH") or 0)  # waitress has checked it (and de-chunked)
        raw = environ["wsgi.input"].read(length) if length else b""
        headers = request.get_headers()
        problem = signature_problem(secret=self._secret, body=raw, now=self._clock(),
                                    timestamp=_one(headers.get("x-slack-request-timestamp")),
                                    signature=_one(headers.get("x-slack-signature")))
        if problem is not None:
            log.warning(msg.http_rejected(client, 401, problem))
            return BoltResponse(status=401, body="")
        try:
            bolt_request = BoltRequest(body=raw.decode("utf-8"), query=request.query_string, headers=headers)
        except Exception as err:  # noqa: BLE001 - parsing does no I/O: any failure is the body's
            log.warning(msg.http_rejected(client, 400, msg.http_unparsable(type(err).__name__)))
            return BoltResponse(status=400, body="")
        return self.app.dispatch(bolt_request)


def _one(value: str | Iterable[str] | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return next(iter(value), None)


class _Routes:
    """The WSGI application: /healthz, else Bolt's adapter (404 for any other path)."""

    def __init__(self, endpoint: SlackEndpoint) -> None:
        self._endpoint = endpoint

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == HEALTH_PATH and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
            return [b"ok\n"]
        try:
            return self._endpoint(environ, start_response)
        except Exception:  # noqa: BLE001 - one line of ours, not waitress's traceback to stderr
            log.exception(msg.http_failed(str(environ.get("PATH_INFO"))))
            start_response("500 Internal Server Error", [("Content-Length", "0")])
            return [b""]


class _TimedChannel(HTTPChannel):
    """waitress's channel, noting since when it has waited for a whole request: since it
    opened, since its last request came in whole, or since the first byte of the request
    it is reading (`reading`; blank lines between requests count as a request's bytes,
    so dripping them does not escape the deadline)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since = time.monotonic()
        self.reading = False
        self.parser_class = lambda adj: _NotingParser(adj, self)  # type: ignore[assignment]  # waitress only calls it

    def may_close(self) -> bool:
        """Nothing of it is being answered or sent, nor is it closing already."""
        return not (self.requests or self.total_outbufs_len or self.will_close or self.close_when_flushed)


class _NotingParser(HTTPRequestParser):
    """waitress's request parser, telling its channel when a request begins and when it is
    in whole. waitress makes one as the first byte of a request comes in."""

    def __init__(self, adj: Any, channel: _TimedChannel) -> None:
        super().__init__(adj)
        self._channel = channel
        if not channel.reading:
            channel.waiting_since, channel.reading = time.monotonic(), True

    def received(self, data: bytes) -> int:
        consumed = super().received(data)
        if self.completed and not self.empty:
            self._channel.waiting_since, self._channel.reading = time.monotonic(), False
        return consumed


# How often the guard looks for requests past their deadline.
_SWEEP_EVERY = 0.1
# How long the event loop waits for something to happen while every connection is taken
# (the guard must look again soon to make room).
_FULL_TURN = 0.05
_TURN = 1.0


class _SlowClientGuard:
    """Run by the event loop's thread before each turn; see the module docstring."""

    def __init__(self, server: Any, settings: HttpSettings, name: str, *, now: float) -> None:
        self._server = server
        self._settings = settings
        self._name = name
        self._waiting = select.poll()  # the listening socket: readable while a connection waits
        self._waiting.register(server.socket.fileno(), select.POLLIN)
        self.closed_late = 0
        self.closed_for_room = 0
        self._said = (0, 0)
        self._next_sweep = now
        self._next_report = now + settings.report_every

    def turn(self, now: float) -> float:
        """Close what must be closed; the seconds the loop may then wait."""
        channels: dict[int, _TimedChannel] = self._server.active_channels
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_EVERY
            for channel in list(channels.values()):
                if channel.reading and now - channel.waiting_since > self._settings.request_deadline \
                        and channel.may_close():
                    channel.will_close = True  # the loop's next turn closes it
                    self.closed_late += 1
        full = len(channels) >= self._settings.max_connections
        if full and self._waiting.poll(0):
            longest = min((c for c in list(channels.values()) if c.may_close()), key=lambda c: c.waiting_since,
                          default=None)
            if longest is not None and now - longest.waiting_since >= self._settings.make_room_after:
                longest.will_close = True
                self.closed_for_room += 1
        if now >= self._next_report:
            self._report(now)
        return _FULL_TURN if full else _TURN

    def _report(self, now: float) -> None:
        self._next_report = now + self._settings.report_every
        late, room = self.closed_late - self._said[0], self.closed_for_room - self._said[1]
        self._said = (self.closed_late, self.closed_for_room)
        if late or room:
            log.warning(msg.http_slow_clients(self._name, late=late, room=room,
                                              deadline=self._settings.request_deadline,
                                              seconds=self._settings.report_every))


class _ConnectionLimitLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("total open connections")


class WaitressServer:
    """Serves a WSGI `application` on host:port (port 0: a free one) on its own thread
    until `stop()`, with `settings`' protections."""

    def __init__(self, application: Callable[..., Iterable[bytes]], *, host: str, port: int, name: str,
                 settings: HttpSettings = HttpSettings()) -> None:
        self.settings = settings
        self._name = name
        self._map: dict[int, Any] = {}
        # Any: waitress's stubs lack effective_host/effective_port and give active_channels
        # (a dict) the type of one channel.
        self._server: Any = cast(Any, create_server(
            application, map=self._map, host=host, port=port,
            backlog=settings.backlog, threads=settings.threads, max_request_body_size=settings.max_body,
            connection_limit=settings.max_connections + _WAITRESS_OWN_SOCKETS,
            channel_timeout=settings.read_timeout, cleanup_interval=1, ident="gpuops",
            # A client hanging up is routine, not a stack trace in the log.
            log_socket_errors=False, clear_untrusted_proxy_headers=True))
        self._server.channel_class = _TimedChannel
        self.guard = _SlowClientGuard(self._server, settings, name, now=time.monotonic())
        # waitress warns "Task queue depth is N" whenever a request finds no idle thread,
        # even the first request after start; a burst from Slack queues for milliseconds.
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
        # waitress says so each time the connections are all taken, and again each time one
        # is freed: under slow clients, many times a second. The guard's line says it once.
        waitress_log = logging.getLogger("waitress")
        if not any(isinstance(f, _ConnectionLimitLines) for f in waitress_log.filters):
            waitress_log.addFilter(_ConnectionLimitLines())
        self._stopping = threading.Event()
        # stop() wakes the loop through waitress's trigger, a pipe the loop closes when it
        # ends: the two never cross (a write to a closed, or reused, descriptor).
        self._closing = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self._server.effective_host}:{self._server.effective_port}"

    @property
    def open_connections(self) -> int:
        return len(self._server.active_channels)

    @property
    def health_url(self) -> str:
        return self.base_url + HEALTH_PATH

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name=f"gpuops-{self._name}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        # The event loop runs here, one turn at a time, so stop() only has to ask: every
        # socket is closed on this thread, never under the loop's feet.
        while not self._stopping.is_set():
            wait = self.guard.turn(time.monotonic())
            wasyncore.loop(timeout=wait, map=self._map, use_poll=True, count=1)
        self._server.task_dispatcher.shutdown(timeout=5)
        self._close()

    def _close(self) -> None:
        with self._closing:
            if not self._closed:
                wasyncore.close_all(self._map)
                self._closed = True

    def stop(self) -> None:
        """Stop serving and close every socket; a second call, or one after the loop
        ended, does nothing more."""
        with self._closing:
            self._stopping.set()
            if not self._closed:
                self._server.pull_trigger()
        if self._thread is not None:
            self._thread.join(timeout=10)
        else:  # never started: nothing else closes its sockets and worker threads
            self._server.task_dispatcher.shutdown(timeout=5)
            self._close()


class SlackHttpServer(WaitressServer):
    """Serves the Bolt `app` (and /healthz) on host:port until `stop()`."""

    def __init__(self, app: App, *, signing_secret: str, host: str = "0.0.0.0", port: int = 3000,
                 settings: HttpSettings = HttpSettings()) -> None:
        super().__init__(_Routes(SlackEndpoint(app, signing_secret=signing_secret)), host=host, port=port,
                         name="http", settings=settings)

    @property
    def url(self) -> str:
        return self.base_url + EVENTS_PATH
