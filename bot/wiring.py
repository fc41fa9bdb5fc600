"""The one place the process's services are built: the fleet view (a watch-backed cache
of the cluster), the database, the request service. Every entry point (`gpuops run`,
`gpuops console`, the one-shot commands) takes a `Runtime` from here; tests build one
from a plain `Fleet` with `runtime_from_fleet_source`.

Leadership (`gpuops run`): every replica answers Slack; only the one holding the engine
Lease (`workflows.engine.lease`) runs the leader's work: the engine, the scheduler
(`bot.scheduler`), the notifier (`bot.notifier`) and the sender of the engine's
Kubernetes Events (`workflows.engine.kube_events`). `Runtime.start_background(identity,
slack=...)` claims the lease and starts a `Leadership` that starts that work when the
lease is gained and stops it the moment it is lost (the lease's change callback, and a
check every second because a claim can also simply run out); regaining starts it afresh.
Between losing the lease and the stop, the notifier and the scheduler ask the lease
before every action, and the engine before every side effect, so nothing acts on a lost
claim. `engine_worker` is the one function that knows the engine's API.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from slack_sdk import WebClient

from bot import messages as msg
from bot.heartbeat import Redo, ReplicaHeartbeat, replica_name
from bot.logs import protect
from bot.metrics import Metrics
from bot.notifier import Notifier, OutboxSlack
from bot.scheduler import WINDOW_STARTS, LeaderScheduler, leader_jobs
from bot.slack_api import observe_slack_calls
from commands.clusters import Clusters
from commands.services import Services
from storage import idempotency
from storage import requests as stored_requests
from storage.database import PerThreadDatabase, default_database_path
from storage.locations import BadDatabaseLocation, DatabaseLocation, database_location
from storage.reachability import DatabaseProbe
from workflows.kinds import kinds_in_force
from workflows.access import Actor
from workflows.config import ConfigError, GpuopsConfig
from workflows.engine.cordons import Cordons
from workflows.engine.kube_events import KubeEventSender
from workflows.engine.lease import EngineLease, LeaseSettings
from workflows.engine.loop import EngineSettings, run_engine
from workflows.fleet.canaries import LastCanaries
from workflows.fleet.clusters import ClusterFleet, WatchedCluster
from workflows.fleet.first_seen import FirstSeen
from workflows.fleet.summary import FleetSource
from workflows.fleet.watchcache import FleetCache
from workflows.kube.errors import KubeError
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.client import observe_kube_calls
from workflows.quotas.service import QuotaService
from workflows.requests.records import RoleLookup
from workflows.signals.service import SignalsService

log = logging.getLogger("gpuops.bot.wiring")


def in_container() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


DATABASE_URL = "GPUOPS_DATABASE_URL"


def database_target(config: GpuopsConfig, explicit: str | Path | None,
                    env: Mapping[str, str] | None = None) -> DatabaseLocation:
    """Where the database is: --database, else a URL from $GPUOPS_DATABASE_URL or the file
    $GPUOPS_DATABASE_URL_FILE names (a mounted Secret), else the file `database_url_file`
    names, else the configuration's `database`, else the default SQLite file. A password
    is taken only from the environment or a file (as the Slack tokens are), never from the
    command line or the configuration (load_config refuses it there); it is registered with
    the log redactor, and every message shows the URL with `***` in its place."""
    env = os.environ if env is None else env
    if explicit:
        given = database_location(explicit)
        if given.has_password:
            raise BadDatabaseLocation(msg.database_password_on_command_line(given.shown, DATABASE_URL))
        return given
    location = _database_url_from(env)
    if location is None and config.database_url_file is not None:
        location = database_location(_url_in_file(str(config.database_url_file), "database_url_file"))
    if location is None:
        location = database_location(config.database or default_database_path(in_container()))
    if location.secrets:
        protect(location.secrets)
    return location


def _database_url_from(env: Mapping[str, str]) -> DatabaseLocation | None:
    direct, file_name = env.get(DATABASE_URL, "").strip(), env.get(f"{DATABASE_URL}_FILE", "").strip()
    if direct and file_name:
        raise BadDatabaseLocation(msg.credential_twice(DATABASE_URL))
    if file_name:
        return database_location(_url_in_file(file_name, f"{DATABASE_URL}_FILE"))
    return database_location(direct) if direct else None


def _url_in_file(path: str, named_by: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise BadDatabaseLocation(msg.database_url_file_unreadable(named_by, path, err.strerror or str(err))) from None
    if not text:
        raise BadDatabaseLocation(msg.database_url_file_empty(named_by, path))
    return text


@dataclass
class Runtime:
    """What a running gpuops holds. Thread-safe: each thread gets its own database
    connection from `database`, and services are built per call."""

    config: GpuopsConfig
    fleet: FleetSource
    database: PerThreadDatabase
    # The Kubernetes API (None in tests and wherever no cluster is used): the engine and
    # the lease need it.
    gateway: KubeGateway | None = None
    leadership: Leadership | None = None
    # Who holds which role now (the Slack app sets its directory, which knows user
    # groups); None: the configuration alone.
    roles: RoleLookup | None = None
    # GPU health from DCGM: one reader for the process, as it remembers the exporters'
    # counters between readings for their rates (made from the configuration).
    signals: SignalsService | None = None
    # With several clusters: every one by name (this runtime's `config` is the home
    # cluster's view of the configuration). None: one cluster.
    clusters: Clusters | None = None
    # Whether the database can be reached now, looked at afresh (readiness, leadership).
    database_probe: DatabaseProbe | None = None
    # This replica's name in the inbox and the heartbeats: its identity and a token of
    # the process (bot.heartbeat).
    replica: str = field(default_factory=lambda: replica_name(replica_identity()))
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.signals is None and self.config.signals is not None:
            self.signals = self.config.signals.service(cluster=self.fleet)

    def services(self, *, delivery: str | None = None) -> Services:
        """Services for one command or click, on the calling thread's connection;
        `delivery`: the Slack delivery they answer (storage.inbox's key)."""
        # Drains read the pods and PDBs they would move straight from the API (the watch
        # cache keeps only operator and GPU pods; a preview names every pod it would evict).
        database = self.database.get()
        # Quotas are listed when asked; nodes and GPU pods come from the cache. A MIG plan
        # reads them too (its pre-flight names the quotas a change would no longer fit).
        quotas = (QuotaService(reader=self.gateway, cluster=self.fleet, settings=self.config.inventory_settings())
                  if self.gateway is not None and isinstance(self.fleet, FleetCache) else None)
        readers = (self.gateway,) if self.gateway is not None else ()
        services = Services.on_database(config=self.config, fleet=self.fleet, database=database,
                                        roles=self.roles_in(self.config), on_approved=self.request_approved,
                                        readers=(*readers, *((quotas,) if quotas is not None else ())),
                                        signals=self.signals, delivery=delivery)
        if self.gateway is not None:
            services.cordons = Cordons(database, self.gateway)
            services.node_reads = self.gateway
            services.quotas = quotas
        if self.clusters is not None:
            services.cluster, services.clusters = self.clusters.home, self.clusters
        return services

    def roles_in(self, config: GpuopsConfig) -> RoleLookup | None:
        """Who holds which role now, in the cluster `config` is about: with several
        clusters, the person's user groups (Slack's) read against that cluster's pools."""
        lookup = self.roles
        if lookup is None or self.clusters is None:
            return lookup

        def in_cluster(user_id: str) -> Actor:
            base = lookup(user_id)
            return config.actor(user_id, groups=base.groups, via=base.via, name=base.name)

        return in_cluster

    def cluster_services(self, name: str, *, delivery: str | None = None) -> Services:
        """Services for cluster `name` (not the home one), on the calling thread's
        connection: its pools and policies, its API for drains, cordons, quotas and the
        plans that read pods; requests stamped with its name. DCGM health only where the
        cluster has its own `signals` (through Prometheus: its exporters' pod IPs are on
        its network). `delivery`: as for `services`."""
        assert self.clusters is not None
        source = self.clusters.sources[name]
        assert isinstance(source, ClusterFleet)
        config = self.clusters.config.for_cluster(name)
        gateway = source.gateway
        database = self.database.get()
        quotas = (QuotaService(reader=gateway, cluster=source.cache, settings=config.inventory_settings())
                  if source.cache is not None else None)
        services = Services.on_database(config=config, fleet=source, database=database,
                                        roles=self.roles_in(config), on_approved=self.request_approved,
                                        readers=(gateway, *((quotas,) if quotas is not None else ())),
                                        delivery=delivery)
        services.cordons = Cordons(database, gateway)
        services.node_reads = gateway
        services.quotas = quotas
        services.cluster, services.clusters = name, self.clusters
        return services

    def first_delivery(self, key: str, *, scope: str, now: dt.datetime) -> bool:
        """True the first time `key` is seen in `scope`, across restarts (SQLite)."""
        return idempotency.remember(self.database.get(), key=key, scope=scope, at=now)

    def start_heartbeat(self, redo: Redo | None) -> ReplicaHeartbeat:
        """Beat as `replica` until `close()`, and run again with `redo` what silent
        replicas acknowledged and never answered (bot.heartbeat)."""
        heartbeat = ReplicaHeartbeat(self.database, name=self.replica, redo=redo).start()
        self._closers.append(heartbeat.stop)
        return heartbeat

    def notify(self) -> None:
        """Something was queued in the outbox: the notifier (if this replica runs it)
        delivers it now instead of at its next timer. Cheap; call it after any change
        that writes an outbox message."""
        if self.leadership is not None:
            self.leadership.notify()

    def request_approved(self) -> None:
        """A request became approved on this replica: if it leads, its scheduler looks for
        runs due now (a window already open starts at once, not at the next tick)."""
        if self.leadership is not None:
            self.leadership.poke_job(WINDOW_STARTS)

    def start_background(self, identity: str, *, slack: WebClient | None, lease: LeaderLease | None = None,
                         check_every: float = 1.0) -> Leadership:
        """Claim the engine lease as `identity` (unique per replica, e.g. the pod name)
        and run the leader's work while it is held; `close()` stops it and gives the
        lease back. `lease` replaces the Kubernetes Lease (tests; `AlwaysHeld` for a
        single replica)."""
        if self.leadership is not None:
            raise RuntimeError("the background work is already started")
        leadership = Leadership(lambda held_lease: leader_workers(self, lease=held_lease, identity=identity,
                                                                 slack=slack),
                                identity=identity, check_every=check_every,
                                database_reach=self.database_probe.check if self.database_probe else None)
        if lease is None:
            if self.gateway is None:
                raise RuntimeError("no Kubernetes API to hold the engine lease with; pass a lease")
            lease = EngineLease(self.gateway, identity=identity, settings=lease_settings(),
                                on_change=leadership.changed)
        self.leadership = leadership
        leadership.start(lease)
        return leadership

    def leading(self) -> bool:
        """Whether this replica holds the engine's Lease now."""
        return self.leadership is not None and self.leadership.leading

    def close(self) -> None:
        leadership, self.leadership = self.leadership, None
        if leadership is not None:
            leadership.stop()
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing must go on
                log.exception("closing %s failed", closer)
        self._closers.clear()
        self.database.close()


def kinds_database(database: str | Path) -> PerThreadDatabase:
    """The database on every thread, knowing each kind of change (workflows/kinds.py): its
    reference rows are written when it opens, so the database takes requests and steps of
    those kinds and refuses others."""
    kinds = kinds_in_force().storage_kinds()
    return PerThreadDatabase(database, request_kinds=kinds.request_kinds, step_kinds=kinds.step_kinds)


def runtime_from_fleet_source(config: GpuopsConfig, fleet: FleetSource, database: str | Path) -> Runtime:
    """A runtime over any fleet source (a FleetCache, or a plain Fleet in tests)."""
    per_thread = kinds_database(database)
    per_thread.get()  # open and migrate now, so a bad file stops the start
    return _with_probe(Runtime(config=config, fleet=fleet, database=per_thread), database)


def _with_probe(runtime: Runtime, database: str | Path) -> Runtime:
    probe = DatabaseProbe(database_location(database))
    runtime.database_probe = probe
    runtime._closers.append(probe.close)
    return runtime


def check_permissions(config: GpuopsConfig, gateway: KubeGateway) -> None:
    """Refuse to start (ConfigError) when a pool asks for what the bot's identity may not
    do: `pdb_timeout_action: delete` deletes pods in any namespace, which the opt-in grant
    (deploy/rbac-pod-delete.yaml, the chart's rbac.allowPodDelete) gives. Better a clear
    stop now than a drain that halts on a 403 in the night."""
    deleting = sorted(name for name, pool in config.pools.items() if pool.pdb_timeout_action == "delete")
    if deleting and not gateway.may("delete", "pods"):
        raise ConfigError(msg.pod_delete_not_granted(deleting, gateway.identity))


def count_api_calls(metrics: Metrics) -> None:
    """Count in `metrics` every Kubernetes API call and Slack Web API call this process
    makes from now on (before the runtime is built: the fleet's first list counts)."""
    observe_kube_calls(metrics.observe_kube)
    observe_slack_calls(metrics.observe_slack)


def build_runtime(config: GpuopsConfig, *, kubeconfig: str | None, context: str | None,
                  database: str | Path, watch: bool = True) -> Runtime:
    """Connect to the cluster (kubeconfig or in-cluster), check the identity may do what
    the configuration asks, list the fleet, start the watches (unless `watch` is False: a
    one-shot command), open the database. With several clusters, the home cluster is the
    one connected to first and the runtime's own; the others are watched in the
    background, each on its own, and a cluster that does not answer holds up nothing."""
    whole = config
    home = config.home_cluster
    if home is not None:
        entry = config.clusters[home]
        config = config.for_cluster(home)
        if entry.kubeconfig is not None or entry.context is not None:
            kubeconfig, context = (str(entry.kubeconfig) if entry.kubeconfig else kubeconfig), entry.context
    gateway = KubeGateway.connect(kubeconfig=kubeconfig, context=context)
    check_permissions(config, gateway)
    per_thread = kinds_database(database)
    per_thread.get()  # open and migrate now, so a bad file stops the start
    if home is not None:  # before the cache reads canary verdicts by their requests' cluster
        named = stored_requests.name_unnamed_cluster(per_thread.get(), cluster=home)
        if named:
            log.info(msg.unnamed_rows_named(named, home))
    cache = FleetCache(gateway, settings=config.inventory_settings(),
                       operator_namespace=config.cluster.operator_namespace,
                       first_seen=FirstSeen(per_thread.get),
                       canaries=LastCanaries(per_thread.get, cluster=home)).start(watch=watch)
    runtime = _with_probe(Runtime(config=config, fleet=cache, database=per_thread), database)
    runtime._closers.append(cache.stop)
    runtime.gateway = gateway
    if home is not None:
        others = {name: _other_cluster(whole, name, per_thread) for name in whole.clusters if name != home}
        for other in others.values():
            runtime._closers.append(other.stop)
            other.start()
        if not watch:  # a one-shot command: give the others a moment to answer
            deadline = time.monotonic() + ONE_SHOT_CLUSTER_WAIT
            for other in others.values():
                other.wait(max(deadline - time.monotonic(), 0.0))
        runtime.clusters = Clusters(config=whole, sources={home: WatchedCluster(home, cache), **others},
                                    make_services=runtime.cluster_services)
    return runtime


# Seconds a one-shot command waits for the clusters other than the home one to be listed.
ONE_SHOT_CLUSTER_WAIT = 15.0


def _other_cluster(config: GpuopsConfig, name: str, database: PerThreadDatabase) -> ClusterFleet:
    """A cluster other than the home one. Its kubeconfig is read now (a missing file or
    context stops the start: the configuration is wrong); the cluster itself is reached
    in the background. Its first-seen records and canary verdicts are its own (node names
    may repeat across clusters)."""
    entry = config.clusters[name]
    try:
        gateway = KubeGateway.connect(kubeconfig=entry.kubeconfig, context=entry.context)
    except KubeError as err:
        raise ConfigError(msg.cluster_kubeconfig_unusable(name, str(err))) from None
    slice_ = config.for_cluster(name)
    return ClusterFleet(name, gateway, lambda api: FleetCache(api, settings=slice_.inventory_settings(),
                                                              operator_namespace=slice_.cluster.operator_namespace,
                                                              first_seen=FirstSeen(database.get, cluster=name),
                                                              canaries=LastCanaries(database.get, cluster=name)))


# ------------------------------------------------------------------ leadership


class LeaderLease(Protocol):
    """What leadership needs of a lease (`workflows.engine.lease.EngineLease`, `AlwaysHeld`)."""

    def held(self) -> bool: ...

    def start(self) -> object: ...

    def stop(self, *, release: bool = True) -> None: ...


class Worker(Protocol):
    """Leader-only work: started once, stopped once (a new term builds new workers)."""

    name: str

    def start(self) -> object: ...

    def stop(self) -> None: ...


def replica_identity() -> str:
    """This replica's name in the lease and the audit log: $POD_NAME (set it from the
    downward API), else the host name (a pod's name in Kubernetes), with the process id
    outside a container so two local processes never share it."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    host = socket.gethostname()
    return host if in_container() else f"{host}-{os.getpid()}"


def lease_settings() -> LeaseSettings:
    """The engine Lease lives in the bot's own namespace: $POD_NAMESPACE, else the
    service account's namespace, else `gpuops`."""
    namespace = os.environ.get("POD_NAMESPACE")
    account = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not namespace and account.is_file():
        namespace = account.read_text().strip()
    return LeaseSettings(namespace=namespace or LeaseSettings.namespace)


class ThreadWorker:
    """`body(stop)` on a thread until `stop` is set; if it returns or raises before
    that, it is started again after `restart_after` seconds (its state is in the
    database, so a restart resumes)."""

    def __init__(self, name: str, body: Callable[[threading.Event], object], *, restart_after: float = 5.0) -> None:
        self.name = name
        self._body = body
        self._restart_after = restart_after
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadWorker:
        self._thread = threading.Thread(target=self._loop, name=f"gpuops-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._body(self._stop)
            except Exception:  # noqa: BLE001 - log, wait, start again
                log.exception("%s stopped with an error; starting it again in %.0f s", self.name,
                              self._restart_after)
            else:
                if not self._stop.is_set():
                    log.warning("%s returned while still wanted; starting it again in %.0f s", self.name,
                                self._restart_after)
            self._stop.wait(self._restart_after)


class NotifierWorker:
    name = "notifier"

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    def start(self) -> NotifierWorker:
        self.notifier.start()
        return self

    def stop(self) -> None:
        self.notifier.stop(timeout=0)

    def join(self, timeout: float) -> bool:
        self.notifier.stop(timeout=timeout)
        return not self.notifier.running


class SchedulerWorker:
    name = "scheduler"

    def __init__(self, scheduler: LeaderScheduler) -> None:
        self.scheduler = scheduler

    def start(self) -> SchedulerWorker:
        self.scheduler.start()
        return self

    def stop(self) -> None:
        self.scheduler.stop()


def cluster_engine_workers(runtime: Runtime, *, lease: LeaderLease, identity: str) -> list[Worker]:
    """With several clusters, an engine for each cluster but the home one, under the
    same Lease (the home cluster's), on its own thread and database connection: it
    drives that cluster's runs through that cluster's API. A cluster not reached yet
    has its engine wait for it (the cluster's own log line says it does not answer)."""
    if runtime.clusters is None:
        return []
    clusters = runtime.clusters
    workers: list[Worker] = []
    for name, each in clusters.sources.items():
        if not isinstance(each, ClusterFleet):
            continue  # the home cluster's engine is `engine_worker`'s
        fleet_of: ClusterFleet = each

        def body(stop: threading.Event, name: str = name, source: ClusterFleet = fleet_of) -> None:
            while (cache := source.cache) is None:  # the cluster has not been listed yet
                if stop.wait(ENGINE_WAITS_FOR_CLUSTER):
                    return
            db = runtime.database.get()
            try:
                slice_ = clusters.config.for_cluster(name)
                settings = EngineSettings(max_parallel_nodes=slice_.engine.max_parallel_nodes,
                                          display_zone=slice_.display_zone, people=slice_.names)
                run_engine(settings, source.gateway, cache, db, identity, stop,
                           lease=lease, on_commit=lambda _commits: runtime.notify(), pools=slice_.pools,
                           cluster=name, home=False,
                           health=slice_.signals.health_queries() if slice_.signals is not None else None,
                           signals=slice_.signals.service(cluster=cache) if slice_.signals is not None else None)
            finally:
                runtime.database.close()

        workers.append(ThreadWorker(f"engine-{name}", body))
        workers.append(events_worker(runtime, fleet_of.gateway, clusters=(name,), lease=lease, name=f"events-{name}"))
    return workers


def events_worker(runtime: Runtime, gateway: KubeGateway, *, clusters: tuple[str | None, ...], lease: LeaderLease,
                  name: str = "events") -> Worker:
    """The sender of the Kubernetes Events the engine queued for `clusters`, through
    `gateway` (workflows.engine.kube_events), asking the lease before every pass."""
    def body(stop: threading.Event) -> None:
        db = runtime.database.get()
        try:
            KubeEventSender(db=db, gateway=gateway, clusters=clusters).run(stop, gate=lease.held)
        finally:
            runtime.database.close()

    return ThreadWorker(name, body)


# Seconds an engine of a cluster not reached yet waits before it looks again.
ENGINE_WAITS_FOR_CLUSTER = 5.0


def engine_worker(runtime: Runtime, *, lease: LeaderLease, identity: str) -> Worker | None:
    """The engine on this replica, or None where it cannot run (no Kubernetes API, or a
    fleet source without watch events). The one function that knows `workflows.engine.loop`:
    it runs `run_engine` on its own thread and database connection, with the lease this
    replica already holds (so the engine checks the same claim before every side effect)
    and with every committed transition waking the notifier."""
    if runtime.gateway is None or not hasattr(runtime.fleet, "add_listener"):
        log.warning("the engine does not run here: %s", "no Kubernetes API" if runtime.gateway is None
                    else "the fleet source sends no watch events")
        return None
    gateway = runtime.gateway

    def body(stop: threading.Event) -> None:
        db = runtime.database.get()
        try:
            settings = EngineSettings(max_parallel_nodes=runtime.config.engine.max_parallel_nodes,
                                      display_zone=runtime.config.display_zone, people=runtime.config.names)
            run_engine(settings, gateway, runtime.fleet, db, identity, stop,  # type: ignore[arg-type]  # hasattr above: a watch cache
                       lease=lease, on_commit=lambda _commits: runtime.notify(), pools=runtime.config.pools,
                       cluster=runtime.config.cluster_name,
                       health=runtime.config.signals.health_queries() if runtime.config.signals is not None else None,
                       # NB: the engine's own reader (its thread), not the commands' one.
                       signals=runtime.config.signals.service(cluster=runtime.fleet)
                       if runtime.config.signals is not None else None)
        finally:
            runtime.database.close()

    return ThreadWorker("engine", body)


def leader_workers(runtime: Runtime, *, lease: LeaderLease, identity: str, slack: WebClient | None) -> list[Worker]:
    """What the lease holder runs, built afresh for each term: the notifier (when there
    is a Slack to post to; the console has none), the scheduler and the engine, each
    asking the lease before it acts."""
    workers: list[Worker] = []
    if slack is not None:
        workers.append(NotifierWorker(Notifier(runtime, OutboxSlack.like(slack), gate=lease.held)))
    workers.append(SchedulerWorker(LeaderScheduler(leader_jobs(runtime), gate=lease.held)))
    engine = engine_worker(runtime, lease=lease, identity=identity)
    if engine is not None:
        workers.append(engine)
        if runtime.gateway is not None:
            home = (None, runtime.config.cluster_name) if runtime.config.cluster_name else (None,)
            workers.append(events_worker(runtime, runtime.gateway, clusters=home, lease=lease))
        workers.extend(cluster_engine_workers(runtime, lease=lease, identity=identity))
    return workers


class Leadership:
    """Starts the leader's workers while the lease is held, stops them when it is not.

    A supervisor thread compares `lease.held()` with what runs: on a gain it builds and
    starts new workers (a term), on a loss it stops them at once (stop flags only; the
    joins come after, off the lease's thread). It looks when the lease calls `changed`
    and every `check_every` seconds, since a claim can run out without a callback.

    Before the lease it asks `database_reach` (None: the database answers, else why
    not): a replica that cannot reach its database stands down, as on a lost lease, and
    more: it ends its term and stops claiming the lease (giving it back if it held it), so
    a replica that can reach the database takes over instead of waiting for a holder that
    can do nothing; once the database answers again it claims the lease again."""

    STOP_WAIT = 15.0

    def __init__(self, make_workers: Callable[[LeaderLease], list[Worker]], *, identity: str,
                 check_every: float = 1.0, database_reach: Callable[[], str | None] | None = None) -> None:
        self._make_workers = make_workers
        self.identity = identity
        self._check_every = check_every
        self._database_reach = database_reach
        # Why this replica stands down (its database cannot be reached), or None.
        self.standing_down: str | None = None
        self._lease: LeaderLease | None = None
        self._workers: list[Worker] = []
        self._lock = threading.Lock()
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        # How many terms this replica led, whether it leads now, and how often the
        # supervisor looked at the lease: for logs and tests.
        self.terms = 0
        self.checks = 0
        self._leading = False

    # -------------------------------------------------------------- control
    def start(self, lease: LeaderLease) -> Leadership:
        self._lease = lease
        lease.start()
        self._thread = threading.Thread(target=self._supervise, name="gpuops-leadership", daemon=True)
        self._thread.start()
        log.info("%s is waiting for the engine lease; only its holder runs the engine, the scheduler and "
                 "the notifier, every replica answers Slack", self.identity)
        return self

    def changed(self, held: bool) -> None:
        """The lease's callback (on its own thread): look now."""
        self._poke.set()

    def notify(self) -> None:
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            if isinstance(worker, NotifierWorker):
                worker.notifier.notify()

    def poke_job(self, name: str) -> None:
        """Run the scheduler's job `name` now, if this replica leads."""
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            if isinstance(worker, SchedulerWorker):
                worker.scheduler.poke(name)

    def stop(self) -> None:
        """Stop the leader's work and give the lease back."""
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(self.STOP_WAIT + 5)
            self._thread = None
        self._end_term("the process is stopping")
        if self._lease is not None:
            self._lease.stop(release=True)

    # -------------------------------------------------------------- observing
    @property
    def leading(self) -> bool:
        with self._cond:
            return self._leading

    @property
    def workers(self) -> list[Worker]:
        with self._lock:
            return list(self._workers)

    def wait_until(self, leading: bool, *, terms: int | None = None, checks: int | None = None,
                   timeout: float = 30.0) -> None:
        """Wait until this replica leads (or not), after `terms` terms and `checks`
        looks at the lease if given."""
        def reached() -> bool:
            return (self._leading == leading and (terms is None or self.terms >= terms)
                    and (checks is None or self.checks >= checks))

        with self._cond:
            if not self._cond.wait_for(reached, timeout=timeout):
                raise TimeoutError(f"leading={self._leading} after {self.terms} terms")

    # -------------------------------------------------------------- the supervisor
    def _supervise(self) -> None:
        assert self._lease is not None
        while not self._stop.is_set():
            self._poke.clear()
            try:
                if self._stands_down():
                    held = False
                else:
                    held = self._lease.held()
                if held and not self._leading:
                    self._begin_term()
                elif not held and self._leading:
                    self._end_term("the engine lease was lost")
            except Exception:  # noqa: BLE001 - the supervisor must outlive any worker's bug
                log.exception("leadership could not start or stop the leader's work")
            with self._cond:
                self.checks += 1
                self._cond.notify_all()
            self._poke.wait(self._check_every)

    def _stands_down(self) -> bool:
        """Whether the database cannot be reached now; the moment it is lost the term ends
        and the claim is given up, the moment it answers again the claim starts again."""
        assert self._lease is not None
        problem = self._database_reach() if self._database_reach is not None else None
        if problem is not None and self.standing_down is None:
            self.standing_down = problem
            log.warning(msg.database_lost_standing_down(self.identity, problem))
            self._end_term(msg.database_lost(problem))
            self._lease.stop(release=True)
        elif problem is None and self.standing_down is not None:
            self.standing_down = None
            log.info(msg.database_back(self.identity))
            self._lease.start()
        return problem is not None

    def _begin_term(self) -> None:
        assert self._lease is not None
        workers = self._make_workers(self._lease)
        started: list[Worker] = []
        try:
            for worker in workers:
                worker.start()
                started.append(worker)
        except BaseException:
            for worker in started:
                worker.stop()
            raise
        with self._lock:
            self._workers = started
        with self._cond:
            self.terms += 1
            self._leading = True
            self._cond.notify_all()
        log.info("%s leads (term %d): running %s", self.identity, self.terms,
                 ", ".join(w.name for w in started))

    def _end_term(self, why: str) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:  # flags first, so all of them stop at once
            try:
                worker.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping the %s failed", worker.name)
        for worker in workers:  # then wait for the action each may have in hand
            join = getattr(worker, "join", None)
            if join is not None and not join(self.STOP_WAIT):
                log.warning("the %s is still finishing its last action", worker.name)
        with self._cond:
            was = self._leading
            self._leading = False
            self._cond.notify_all()
        if was:
            log.log(logging.INFO if self._stop.is_set() else logging.WARNING,
                    "%s stopped the engine, scheduler and notifier: %s", self.identity, why)
