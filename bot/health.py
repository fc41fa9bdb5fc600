"""The health port (default 8080, `gpuops run --health-port`) and the metrics port
(default 8081, `--metrics-port`), in both Slack modes:

- `/healthz` (health port): the process answers (a liveness probe: restart it if not);
- `/readyz` (health port): the database can be reached (a fresh look, not the bot's open
  connections) and the watch cache has listed every resource (a readiness probe). A standby replica (another holds the engine's
  Lease) is ready, it answers Slack, and says it is a standby. With several clusters, a
  line says whether each other cluster answers; one that does not leaves the replica ready;
- `/metrics` (metrics port): Prometheus's text format (`bot.metrics`).

Each port is its own waitress server (its listener, event loop and worker threads), apart
from Slack's port and from each other, so the kubelet's probes never queue behind Slack's
requests, scrapes or whoever else is connected. The kubelet probes the pod's IP, so the
health port listens on every interface like the others; it keeps answering under slow
clients because its requests must arrive whole within 2 s and, when its 20 connections
are all taken, the one that has waited longest for a whole request makes room
(`bot.http_server`). The chart's NetworkPolicy lets only `metricsFrom` reach the metrics
port and nobody but the node (the kubelet, which NetworkPolicy always lets through) reach
the health port.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from bot import messages as msg
from bot.http_server import HEALTH_PATH, HttpSettings, StartResponse, WaitressServer
from bot.metrics import Metrics
from storage.database import Database
from workflows.fleet.clusters import Reach

log = logging.getLogger("gpuops.bot.health")

READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
DEFAULT_PORT = 8080
DEFAULT_METRICS_PORT = 8081

class Synced(Protocol):
    @property
    def synced(self) -> bool: ...


class Reachable(Protocol):
    def reach(self, now: dt.datetime) -> Reach: ...


@dataclass
class Readiness:
    """What /readyz asks: each may be missing (nothing to check)."""

    database: Callable[[], Database] | None = None
    # Whether the database can be reached afresh (storage.reachability.DatabaseProbe.check:
    # None, or why not): asked instead of `database`, whose open connection cannot tell.
    reach: Callable[[], str | None] | None = None
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
        if self.reach is not None:
            problem = self.reach()
            ready = problem is None
            lines.append("database: open" if problem is None else msg.database_unreachable(problem))
        elif self.database is not None:
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


class _ProbeRoutes:
    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

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
        return _answer(start_response, "404 Not Found", b"", "text/plain")


class _MetricsRoutes:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", b"", "text/plain")
        if path != METRICS_PATH:
            return _answer(start_response, "404 Not Found", b"", "text/plain")
        try:
            body = generate_latest(self._metrics.registry)
        except Exception:  # noqa: BLE001 - a scrape that fails says so, the bot goes on
            log.exception("collecting metrics failed")
            return _answer(start_response, "500 Internal Server Error", b"", "text/plain")
        return _answer(start_response, "200 OK", body, CONTENT_TYPE_LATEST)


def _answer(start_response: StartResponse, status: str, body: bytes, content_type: str) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


# The probes' server: the kubelet sends a probe whole in one packet and gives up after its
# timeoutSeconds (1 s by default), so a request gets 2 s, and a connection that has waited
# 0.2 s for a whole one makes room when all are taken.
PROBE_SETTINGS = HttpSettings(threads=2, max_connections=20, max_body=1024, read_timeout=2, request_deadline=2.0,
                              make_room_after=0.2)
METRICS_SETTINGS = HttpSettings(threads=2, max_connections=20, max_body=1024)


class HealthServer(WaitressServer):
    """/healthz and /readyz on host:port, for the kubelet."""

    def __init__(self, readiness: Readiness, *, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 settings: HttpSettings = PROBE_SETTINGS) -> None:
        super().__init__(_ProbeRoutes(readiness), host=host, port=port, name="health", settings=settings)


class MetricsServer(WaitressServer):
    """/metrics on host:port, for Prometheus."""

    def __init__(self, metrics: Metrics, *, host: str = "0.0.0.0", port: int = DEFAULT_METRICS_PORT,
                 settings: HttpSettings = METRICS_SETTINGS) -> None:
        super().__init__(_MetricsRoutes(metrics), host=host, port=port, name="metrics", settings=settings)
