"""HTTP mode: a small threaded HTTP server in front of the Bolt app.

Slack POSTs slash commands, clicks and events to `/slack/events`; the app checks the
signature and the timestamp (older than 5 minutes is refused) and answers 401 when
either is wrong. `/healthz` answers 200 for a liveness probe. Bodies over 1 MiB are
refused before they are read: nothing Slack sends is that large.

Put it behind the cluster's TLS ingress; Slack only calls HTTPS URLs.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from slack_bolt import App, BoltRequest

log = logging.getLogger("gpuops.bot.http")

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
MAX_BODY = 1 << 20


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: App


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "gpuops"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if urlsplit(self.path).path == HEALTH_PATH:
            self._send(200, b"ok\n", {"Content-Type": "text/plain"})
        else:
            self._send(404, b"not found\n", {"Content-Type": "text/plain"})

    def do_POST(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        if url.path != EVENTS_PATH:
            self._send(404, b"not found\n", {"Content-Type": "text/plain"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._send(413, b"request too large\n", {"Content-Type": "text/plain"})
            return
        body = self.rfile.read(length).decode("utf-8", errors="replace")
        headers = {name.lower(): value for name, value in self.headers.items()}
        response = self.server.app.dispatch(BoltRequest(body=body, query=url.query, headers=headers))
        out_headers = {name: values[0] for name, values in response.headers.items() if values}
        self._send(response.status, (response.body or "").encode("utf-8"), out_headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s " + format, self.address_string(), *args)


class SlackHttpServer:
    """Serves `app` on host:port (port 0: a free one) until `stop()`."""

    def __init__(self, app: App, *, host: str = "0.0.0.0", port: int = 3000) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.app = app
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{EVENTS_PATH}"

    def start(self) -> SlackHttpServer:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="gpuops-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
