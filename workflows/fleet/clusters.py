"""Several clusters, one gpuops: whether each cluster's API answers, and the fleet of a
cluster gpuops reads but does not change (not its home cluster).

A cluster's watch cache is its own: a cluster that does not answer is reported as down
with what was last seen of it, and never holds up a command about another. A cluster
that was down when gpuops started is connected to in the background, with backoff, and
joins as soon as it answers.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from workflows.durations import utc_now
from workflows.fleet import messages as fleet_msg
from workflows.fleet.summary import Fleet, FleetSource
from workflows.fleet.watchcache import FleetCache
from workflows.kube.errors import KubeError
from workflows.kube.gateway import KubeGateway
from workflows.kube.objects import NodeObject, PodObject

log = logging.getLogger("gpuops.clusters")

ReachState = Literal["up", "down", "connecting"]
# What the cache must hear to call a cluster up: its nodes and pods.
_VITAL = ("nodes", "pods")
# Seconds between attempts to reach a cluster never reached yet (doubling up to the last).
_CONNECT_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)


class ClusterUnreachable(Exception):
    """A cluster gpuops has not been able to list yet: which, since when it has been
    trying and the API's or the network's last word. `text` words it in the zone its
    reader reads times in (str() in UTC, for logs)."""

    def __init__(self, cluster: str, *, since: dt.datetime | None = None, reason: str | None = None) -> None:
        self.cluster, self.since, self.reason = cluster, since, reason
        super().__init__(self.text())

    def text(self, zone: dt.tzinfo = dt.timezone.utc) -> str:
        return fleet_msg.cluster_not_answered(self.cluster, since=self.since, reason=self.reason, zone=zone)


@dataclass(frozen=True, slots=True)
class Reach:
    """Whether a cluster's API answers: `up`, `down` (it answered once, not now; its fleet
    is what was last seen) or `connecting` (never answered yet). `since`: when it went
    down or since when gpuops has been trying; `reason`: the API's or the network's last
    word."""

    cluster: str
    state: ReachState
    since: dt.datetime | None = None
    reason: str | None = None


def cache_reach(cluster: str, cache: FleetCache, *, now: dt.datetime) -> Reach:
    """A started cache's cluster: down while its nodes' or pods' list or watch fails."""
    lost = [state.lost_for for state in cache.states() if state.resource in _VITAL and state.lost_for is not None]
    if not lost:
        return Reach(cluster=cluster, state="up")
    return Reach(cluster=cluster, state="down", since=now - dt.timedelta(seconds=max(lost)))


class ClusterFleet:
    """The fleet of a cluster other than the home one: its watch cache, started in the
    background (retried until the cluster answers), then kept current by its watches."""

    def __init__(self, name: str, gateway: KubeGateway, make_cache: Callable[[KubeGateway], FleetCache], *,
                 clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.name = name
        # The cluster's API as gpuops' identity there (the engine acts through it too).
        self.gateway = gateway
        self._make_cache = make_cache
        self._clock = clock
        self._cache: FleetCache | None = None
        self._trying_since: dt.datetime | None = None
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ClusterFleet:
        self._trying_since = self._clock()
        self._thread = threading.Thread(target=self._connect, name=f"cluster-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _connect(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            cache = self._make_cache(self.gateway)
            try:
                cache.start(watch=True)
            except KubeError as err:
                cache.stop()
                if self._error is None:
                    log.warning("cluster %s does not answer: %s; trying again in the background", self.name, err)
                self._error = str(err)
                self._stop.wait(_CONNECT_BACKOFF[min(attempt, len(_CONNECT_BACKOFF) - 1)])
                attempt += 1
                continue
            if self._stop.is_set():
                cache.stop()
                return
            if self._error is not None:
                log.info("cluster %s answers; its fleet is listed", self.name)
            self._cache = cache
            return

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the first list; whether it is in."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._cache is not None

    def stop(self) -> None:
        self._stop.set()
        if self._cache is not None:
            self._cache.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def cache(self) -> FleetCache | None:
        """The cluster's cache once it has been listed (None before)."""
        return self._cache

    def reach(self, now: dt.datetime) -> Reach:
        if self._cache is None:
            return Reach(cluster=self.name, state="connecting", since=self._trying_since, reason=self._error)
        return cache_reach(self.name, self._cache, now=now)

    def fleet(self, now: dt.datetime) -> Fleet:
        """What is known of the cluster's fleet (the last seen while it is down); raises
        ClusterUnreachable before it was ever listed."""
        if self._cache is None:
            raise ClusterUnreachable(self.name, since=self._trying_since, reason=self._error)
        return self._cache.fleet(now)

    def node(self, name: str) -> NodeObject | None:
        """The node object the cluster's watch cache keeps (None before it was listed)."""
        return self._cache.node(name) if self._cache is not None else None

    def pods_on(self, node: str) -> list[PodObject]:
        return self._cache.pods_on(node) if self._cache is not None else []


class WatchedCluster:
    """The home cluster's cache seen as one cluster of several (the bot starts it
    itself, before anything else: the engine needs it)."""

    def __init__(self, name: str, cache: FleetCache) -> None:
        self.name = name
        self.cache = cache

    def reach(self, now: dt.datetime) -> Reach:
        return cache_reach(self.name, self.cache, now=now)

    def fleet(self, now: dt.datetime) -> Fleet:
        return self.cache.fleet(now)

    def node(self, name: str) -> NodeObject | None:
        return self.cache.node(name)

    def pods_on(self, node: str) -> list[PodObject]:
        return self.cache.pods_on(node)


class ClusterSource(FleetSource, Protocol):
    """A cluster as gpuops reads it (ClusterFleet, WatchedCluster): its fleet and whether
    its API answers."""

    def reach(self, now: dt.datetime) -> Reach: ...


@dataclass(frozen=True, slots=True)
class ClusterGlance:
    """One cluster at a glance, for a line in status or the handover: whether it answers
    and, once it was ever listed, its totals (the last seen while it is down)."""

    reach: Reach
    nodes: int | None = None  # None: never listed
    ready: int = 0
    advertised: int = 0
    physical: int = 0
    critical: int = 0
    warning: int = 0

    @property
    def cluster(self) -> str:
        return self.reach.cluster


def glance(source: ClusterSource, *, now: dt.datetime) -> ClusterGlance:
    reach = source.reach(now)
    try:
        fleet = source.fleet(now)
    except ClusterUnreachable:
        return ClusterGlance(reach=reach)
    pools = fleet.pools
    return ClusterGlance(reach=reach, nodes=sum(p.nodes_total for p in pools), ready=sum(p.nodes_ready for p in pools),
                         advertised=sum(p.gpus_advertised for p in pools),
                         physical=sum(p.gpus_physical for p in pools),
                         critical=sum(f.severity == "critical" for f in fleet.findings),
                         warning=sum(f.severity == "warning" for f in fleet.findings))
