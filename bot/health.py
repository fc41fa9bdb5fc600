"""The health port (default 8080, `gpuops run --health-port`), in both Slack modes:

- `/healthz`: the process answers (a liveness probe: restart it if not);
- `/readyz`: the database opens and answers, and the watch cache has listed every
  resource (a readiness probe). A standby replica (another holds the engine's Lease) is
  ready, it answers Slack, and says it is a standby. With several clusters, a line says
  whether each other cluster answers; one that does not leaves the replica ready;
- `/metrics`: Prometheus's text format (`bot.metrics`).

Served by waitress (as HTTP mode is), apart from Slack's port, so probes and scrapes never
queue behind Slack's requests and the Slack port can stay the only one exposed outside.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from bot import messages as msg
from bot.http_server import HEALTH_PATH, HttpSettings, WaitressServer
from bot.metrics import Metrics
from storage.database import Database
from workflows.fleet.clusters import Reach

log = logging.getLogger("gpuops.bot.health")

READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
DEFAULT_PORT = 8080

StartResponse = Callable[..., Any]


class Synced(Protocol):
    @property
    def synced(self) -> bool: ...


class Reachable(Protocol):
    def reach(self, now: dt.datetime) -> Reach: ...


@dataclass
class Readiness:
    """What /readyz asks: each may be missing (nothing to check)."""

    database: Callable[[], Database] | None = None
    cache: Synced | None = None
    leader: Callable[[], bool] | None = None
    # With several clusters, the others (name -> cluster): a line each, never unready for
    # them (a replica restarted or taken out of service would not bring them back, and
    # would stop answering about the clusters that do answer).
    others: Mapping[str, Reachable] | None = None
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)

    def check(self) -> tuple[bool, list[str]]:
        """Ready or not, with one line per check."""
        lines, ready = [], True
        if self.database is not None:
            try:
                self.database().query_one("SELECT 1 AS one")
                lines.append("database: open")
            except Exception as err:  # noqa: BLE001 - any failure means not ready, said in one line
                ready = False
                lines.append(f"database: {type(err).__name__}: {err}")
        if self.cache is not None:
            synced = self.cache.synced
            ready = ready and synced
            lines.append("watch cache: synced" if synced else "watch cache: still listing the fleet")
        now = self.clock()
        for name, other in sorted((self.others or {}).items()):
            reach = other.reach(now)
            lines.append(msg.cluster_readiness(name, state=reach.state, since=reach.since, now=now, reason=reach.reason))
        if self.leader is not None:
            lines.append("engine: this replica holds the Lease" if self.leader() else
                         "engine: standby (another replica holds the Lease); answering Slack")
        return ready, lines


class _Routes:
    def __init__(self, readiness: Readiness, metrics: Metrics) -> None:
        self._readiness = readiness
        self._metrics = metrics

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", b"", "text/plain")
        if path == HEALTH_PATH:
            return _answer(start_response, "200 OK", b"ok\n", "text/plain")
        if path == READY_PATH:
            ready, lines = self._readiness.check()
            body = ("\n".join(lines) + "\n").encode()
            return _answer(start_response, "200 OK" if ready else "503 Service Unavailable", body, "text/plain")
        if path == METRICS_PATH:
            try:
                body = generate_latest(self._metrics.registry)
            except Exception:  # noqa: BLE001 - a scrape that fails says so, the bot goes on
                log.exception("collecting metrics failed")
                return _answer(start_response, "500 Internal Server Error", b"", "text/plain")
            return _answer(start_response, "200 OK", body, CONTENT_TYPE_LATEST)
        return _answer(start_response, "404 Not Found", b"", "text/plain")


def _answer(start_response: StartResponse, status: str, body: bytes, content_type: str) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


class HealthServer(WaitressServer):
    def __init__(self, readiness: Readiness, metrics: Metrics, *, host: str = "0.0.0.0",
                 port: int = DEFAULT_PORT) -> None:
        super().__init__(_Routes(readiness, metrics), host=host, port=port, name="health",
                         settings=HttpSettings(threads=2, max_connections=20, max_body=1024))
