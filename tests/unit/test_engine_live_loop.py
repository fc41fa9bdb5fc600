"""The engine's live loop, driven for real through `Engine.run` and `run_engine` over the
in-memory cluster:

- it works until it is stopped, reading the database at every turn (an idle engine
  still starts a run another process started), and with `exit_when_idle` it returns
  once no run is left;
- a node or pod event from the watch cache wakes that node's waiting step at once; the
  other nodes' steps wait for their time on the monotonic clock; an event that names no
  node wakes none, and events while the engine is not running are not kept; the
  engine listens to the cache once however often it runs;
- a due timer brings the loop round at once however long the control check is;
- a replica that does not hold the lease, or loses it in the middle of a pass, does
  nothing more, warns once how many steps it leaves to the next holder, and resumes
  from the database when it holds the lease again, repeating no intent;
- a database that cannot answer stops one pass with a warning, not the loop;
- `run_engine` makes its own Lease from `config.lease`, runs when it gains it, gives it
  back when it stops and returns the engine; a lease it was given it never stops; it
  warns once when no pool policies are given, and hands the engine its settings, pools,
  cluster, home, commit callback, GPU signals and service-health reader; a lease gained
  before the engine exists is still held and renewed.

The loop is driven by a scripted stop flag (before each wait of the engine it runs the
script's next action, then stops), a lease whose answer the test sets, a stand-in watch
cache the test fires events through, and a monotonic clock that moves only when told.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from storage import audit
from storage import runs as stored_runs
from storage.database import Database
from storage.errors import DatabaseUnavailable
from workflows.engine.lease import LeaseSettings
from workflows.engine.loop import Engine, EngineSettings, run_engine
from workflows.plans import NodeStep
from workflows.pools.config import PoolConfig

from tests.unit.test_engine_lease import Leases
from tests.unit.test_engine_safety import NOW, Drain
from tests.unit.test_engine_safety import cluster as cluster  # noqa: F401  (the two-node drain's cluster fixture)
from tests.unit.test_engine_service_health import ERRORS, StandInPrometheus
from tests.unit.test_engine_signal_gate import StandInSignals
from tests.unit.test_safety_rules import PlannedRun

JOBS = {"gpu-01": "ml/job-01", "gpu-02": "ml/job-02"}
ENGINE_LOG = "gpuops.engine"


# ------------------------------------------------------------------ stand-ins


class Script(threading.Event):
    """The engine's stop flag, run by the test: before each of the engine's waits it runs
    the script's next action (fire an event, lose the lease, move the clock); once the
    actions are done it is set. The engine asks it twice a turn: before its wait and
    after it."""

    def __init__(self, *actions: Callable[[], object]) -> None:
        super().__init__()
        self.actions = list(actions)
        self.asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        if self.asked % 2 == 1 and not super().is_set():  # the top of a turn, before the wait
            if self.actions:
                self.actions.pop(0)()
            else:
                self.set()
        return super().is_set()


def nothing() -> None:
    """A turn in which nothing happens outside the engine."""


class Lease:
    """The engine lease as the test sets it: held until the test says otherwise."""

    def __init__(self) -> None:
        self.holding = True
        self.stopped: list[bool] = []  # each `stop(release=...)` asked of it

    def held(self) -> bool:
        return self.holding

    def stop(self, *, release: bool = True) -> None:
        self.stopped.append(release)


class Watch:
    """The watch cache as the engine sees it: the cluster's fleet, the listeners the engine
    adds, and events the test delivers to them as FleetCache does."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.listeners: list[Callable[[str, str, Any], None]] = []
        self.listening = threading.Event()

    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None:
        self.listeners.append(listener)
        self.listening.set()

    def fleet(self, now: dt.datetime) -> Any:
        return self.cluster.fleet(now)

    def event(self, resource: str, view: Any, kind: str = "MODIFIED") -> None:
        for listener in self.listeners:
            listener(resource, kind, view)

    def node_changed(self, node: str) -> None:
        self.event("nodes", self.cluster.node(node))

    def pod_changed(self, uid: str) -> None:
        self.event("pods", self.cluster.pods[uid].pod)


class Mono:
    """The engine's monotonic clock: it moves only when the test moves it. A monotonic
    clock's origin means nothing: it starts wherever the test says."""

    def __init__(self, origin: float = 1000.0) -> None:
        self.t = origin

    def __call__(self) -> float:
        return self.t


class Blocked:
    """A drain of gpu-01 and gpu-02 (or only gpu-01) whose GPU jobs a PodDisruptionBudget
    protects, driven by an engine this test builds: once both are cordoned each node's
    evict step waits, trying its eviction again when it is looked at."""

    def __init__(self, db: Database, cluster: Any, *, words: str = "gpu-01 gpu-02 for 10m rack move",
                 control_check: float = 0.0, lease: Lease | None = None, db_seen: Any = None) -> None:
        cluster.blocked.update({"uid-job-01", "uid-job-02"})
        self.drain = Drain(db, cluster, "wait", words=words)
        self.cluster, self.db = cluster, db
        self.watch, self.mono, self.lease = Watch(cluster), Mono(), lease or Lease()
        self.engine = Engine(db=db_seen or db, gateway=cluster, cache=self.watch, lease=self.lease, replica="engine-0",
                             settings=EngineSettings(control_check=dt.timedelta(seconds=control_check)),
                             clock=lambda: self.drain.clock.now, monotonic=self.mono)

    def run(self, *actions: Callable[[], object], exit_when_idle: bool = False) -> None:
        self.engine.run(Script(*actions), exit_when_idle=exit_when_idle)

    def evicted(self) -> list[str]:
        """Every eviction the cluster was asked for, in order."""
        return [target for _, target in self.cluster.did("evict")]

    def audited(self, action: str) -> list[str]:
        return self.drain.audited(action)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ENGINE_LOG and r.levelno == logging.WARNING]


# ------------------------------------------------------------------ the loop and its wake-ups


def test_a_node_event_wakes_that_nodes_waiting_step_at_once_while_the_other_waits_for_its_time(db, cluster):
    blocked = Blocked(db, cluster)

    blocked.run(nothing, lambda: blocked.watch.node_changed("gpu-01"), nothing)

    # The first turn cordons both nodes and tries each eviction once; then only gpu-01's
    # step is looked at again: gpu-02's is due 2s later, and the clock did not move.
    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-01"]
    assert cluster.did("cordon") == [("cordon", "gpu-01"), ("cordon", "gpu-02")]


def test_a_pod_event_wakes_the_node_the_pod_runs_on(db, cluster):
    blocked = Blocked(db, cluster)

    blocked.run(nothing, lambda: blocked.watch.pod_changed("uid-job-02"))

    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-02"]


def test_events_that_name_no_node_wake_no_step(db, cluster, make):
    blocked = Blocked(db, cluster)
    pending = dataclasses.replace(make.workload("gpu-01", gpus=1, name="queued"), node_name=None)

    def events_of_no_node() -> None:
        blocked.watch.event("pods", pending, "ADDED")  # not scheduled yet
        blocked.watch.event("deployments", object())  # neither a node nor a pod
        blocked.watch.event("nodes", None, "DELETED")  # a deletion of a node the cache never had
        blocked.engine.wake()  # look at the runs, no node in particular

    blocked.run(nothing, events_of_no_node, nothing)

    assert blocked.evicted() == ["ml/job-01", "ml/job-02"]


def test_every_node_woken_while_the_engine_waited_is_looked_at_in_the_one_next_pass(db, cluster):
    blocked = Blocked(db, cluster)

    def both_nodes_change() -> None:
        blocked.watch.node_changed("gpu-02")
        blocked.watch.pod_changed("uid-job-01")

    blocked.run(nothing, both_nodes_change)

    # One pass looks at both, in the plan's order, whatever order the events came in.
    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-01", "ml/job-02"]


def test_wake_with_a_node_looks_at_that_nodes_step_at_once(db, cluster):
    blocked = Blocked(db, cluster)

    blocked.run(nothing, lambda: blocked.engine.wake("gpu-02"), nothing)

    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-02"]


def test_events_while_the_engine_is_not_running_are_not_kept(db, cluster):
    blocked = Blocked(db, cluster)
    blocked.run(nothing)

    blocked.watch.node_changed("gpu-01")  # between two runs of the loop: nobody listens
    blocked.run(nothing)

    assert blocked.evicted() == ["ml/job-01", "ml/job-02"]


def test_an_engine_run_twice_listens_to_the_cache_once(db, cluster):
    blocked = Blocked(db, cluster)

    blocked.run(nothing)
    blocked.run(nothing)

    assert len(blocked.watch.listeners) == 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize("origin", [1000.0, -1000.0])
def test_a_due_timer_brings_the_loop_round_however_long_the_control_check_is(db, cluster, origin):
    blocked = Blocked(db, cluster, words="gpu-01 for 10m rack move", control_check=3600)
    blocked.mono.t = origin  # wherever the monotonic clock starts
    blocked.engine.wake()  # the first look, at once

    def three_seconds_pass() -> None:
        blocked.mono.t += 3  # the blocked eviction is due again after 2s

    blocked.run(nothing, three_seconds_pass, three_seconds_pass)

    assert blocked.evicted() == ["ml/job-01", "ml/job-01", "ml/job-01"]


def test_an_idle_engine_keeps_reading_the_database_and_starts_a_run_another_process_started(db, cluster):
    watch = Watch(cluster)
    engine = Engine(db=db, gateway=cluster, cache=watch, lease=Lease(), replica="engine-0",
                    settings=EngineSettings(control_check=dt.timedelta(0)))
    started: list[PlannedRun] = []

    engine.run(Script(nothing, lambda: started.append(cordon_uncordon(db, cluster))))

    (run,) = started
    assert run.state() == "succeeded"
    assert cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01")]


def test_with_exit_when_idle_the_loop_drives_the_run_to_its_end_and_returns(db, cluster):
    run = cordon_uncordon(db, cluster, hold_s=30)
    mono = Mono()

    def moving() -> float:
        mono.t += 10  # each look at the clock finds ten seconds gone: every wait is over
        run.now = NOW + dt.timedelta(seconds=mono.t + 1000)
        return mono.t

    engine = Engine(db=db, gateway=cluster, cache=Watch(cluster), lease=Lease(), replica="engine-0",
                    settings=EngineSettings(control_check=dt.timedelta(0)), clock=lambda: run.now, monotonic=moving)
    stop = threading.Event()

    engine.run(stop, exit_when_idle=True)

    assert not stop.is_set() and run.state() == "succeeded"
    assert cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01")]


# ------------------------------------------------------------------ the lease and the database


def test_a_replica_without_the_lease_does_nothing_warns_once_and_resumes_when_it_holds_it_again(db, cluster, caplog):
    blocked = Blocked(db, cluster)

    def lose() -> None:
        blocked.lease.holding = False
        blocked.watch.node_changed("gpu-01")

    def regain() -> None:
        blocked.lease.holding = True

    with caplog.at_level(logging.WARNING, logger=ENGINE_LOG):
        blocked.run(nothing, lose, lambda: blocked.watch.node_changed("gpu-02"), regain)

    assert warnings(caplog) == ["engine-0: the engine lease is not held; 2 steps in flight are left to the next "
                                "holder"]
    # Nothing while it did not hold the lease; then both steps taken up again from the
    # database, each tried once more, no intent recorded twice.
    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-01", "ml/job-02"]
    assert blocked.audited("step.resumed") == ["gpu-01", "gpu-02"]
    assert blocked.audited("pod.evict") == ["ml/job-01", "ml/job-02"]


def test_a_lease_lost_in_the_middle_of_a_pass_stops_it_before_the_next_write_and_the_next_turn_resumes(
        db, cluster, caplog):
    blocked = Blocked(db, cluster)
    evict = cluster.evict_pod

    def lost_while_evicting(namespace: str, name: str, **kwargs: Any) -> None:
        if blocked.evicted().count("ml/job-01") == 1 and name == "job-01":
            blocked.lease.holding = False  # another replica took over during this call
        evict(namespace, name, **kwargs)

    def regain() -> None:
        blocked.lease.holding = True
        blocked.engine.wake("gpu-01")

    cluster.evict_pod = lost_while_evicting
    with caplog.at_level(logging.WARNING, logger=ENGINE_LOG):
        blocked.run(nothing, lambda: blocked.engine.wake("gpu-01") or blocked.engine.wake("gpu-02"), regain)

    assert warnings(caplog) == ["engine-0: the engine lease was lost; 2 steps in flight are left to the next holder"]
    # gpu-02's step was not tried after the loss; the next turn took both up again.
    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-01", "ml/job-01", "ml/job-02"]
    assert blocked.audited("step.resumed") == ["gpu-01", "gpu-02"]


class LockedOnce:
    """The database, answering "database is locked" to the first read after `lock()`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.locked = False

    def lock(self) -> None:
        self.locked = True

    def query(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        if self.locked:
            self.locked = False
            raise DatabaseUnavailable("database is locked")
        return self._db.query(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_database_that_cannot_answer_stops_one_pass_with_a_warning_and_the_loop_goes_on(db, cluster, caplog):
    locked = LockedOnce(db)
    blocked = Blocked(db, cluster, db_seen=locked)

    with caplog.at_level(logging.WARNING, logger=ENGINE_LOG):
        blocked.run(nothing, locked.lock, lambda: blocked.watch.node_changed("gpu-01"))

    assert warnings(caplog) == ["engine pass stopped by the database: database is locked"]
    assert blocked.evicted() == ["ml/job-01", "ml/job-02", "ml/job-01"]


# ------------------------------------------------------------------ run_engine


def cordon_uncordon(db: Database, cluster: Any, *, nodes: tuple[str, ...] = ("gpu-01",),
                    hold_s: int | None = None, waves: list[tuple[str, ...]] | None = None) -> PlannedRun:
    """A run that cordons `nodes` (one wave, or `waves`) and gives each back (after a
    hold of `hold_s`), started."""
    def steps(node: str) -> tuple[NodeStep, ...]:
        hold = (NodeStep("hold", node, {"seconds": hold_s}),) if hold_s else ()  # type: ignore[arg-type]
        return (NodeStep("cordon", node, {}), *hold, NodeStep("uncordon", node, {}))  # type: ignore[arg-type]

    return PlannedRun(db, cluster, waves or [nodes], steps=steps)


class LeaseApi(Leases):
    """The cluster's API with its Lease (test_engine_lease.Leases keeps the Lease's
    compare-and-set). It answers the first read of the Lease only once the engine listens
    to the watch cache, as a slow API server would: the lease is gained while the engine
    already waits."""

    def __init__(self, cluster: Any, watch: Watch | None = None) -> None:
        super().__init__()
        self._cluster, self._watch = cluster, watch

    def get_lease(self, namespace: str, name: str) -> Any:
        if self._watch is not None:
            assert self._watch.listening.wait(timeout=5)
        return super().get_lease(namespace, name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


NO_POOLS = "engine-0: no pool policies given: waves are not checked against the pools before they start"


@pytest.mark.timeout(10)
def test_run_engine_gains_its_own_lease_runs_once_it_holds_it_gives_it_back_and_returns_the_engine(
        db, cluster, caplog):
    run = cordon_uncordon(db, cluster)
    watch = Watch(cluster)
    api = LeaseApi(cluster, watch)
    commits: list[int] = []
    # An hour between reads of the database: only the lease's change wakes the engine.
    settings = EngineSettings(lease=LeaseSettings(namespace="ops", name="gpuops-engine-test"),
                              control_check=dt.timedelta(hours=1))

    with caplog.at_level(logging.WARNING, logger=ENGINE_LOG):
        engine = run_engine(settings, api, watch, db, "engine-0", threading.Event(), on_commit=commits.append,
                            exit_when_idle=True, pools=run.cfg.pools)

    assert run.state() == "succeeded"
    assert cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01")]
    assert commits == list(range(1, engine.commits + 1)) and commits
    assert {e.detail["replica"] for e in audit.for_run(db, run.run_id) if e.action.startswith("step.")} == {
        "engine-0"}
    # The Lease it made, where its settings say, handed back (no holder) as it stopped.
    assert api.record is not None
    assert (api.record.namespace, api.record.name, api.record.holder) == ("ops", "gpuops-engine-test", None)
    assert warnings(caplog) == []


def test_run_engine_never_stops_a_lease_it_was_given_and_warns_once_without_pools(db, cluster, caplog):
    lease = Lease()
    started: list[PlannedRun] = []
    settings = EngineSettings(control_check=dt.timedelta(0), max_parallel_nodes=1)

    def a_run_is_started() -> None:
        started.append(cordon_uncordon(db, cluster, nodes=("gpu-01", "gpu-02")))

    with caplog.at_level(logging.WARNING, logger=ENGINE_LOG):
        run_engine(settings, cluster, Watch(cluster), db, "engine-0", Script(nothing, a_run_is_started), lease=lease)

    # Idle at first, it went on and drove the run started meanwhile, one node at a time.
    assert started[0].state() == "succeeded"
    assert cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01"), ("cordon", "gpu-02"),
                             ("uncordon", "gpu-02")]
    assert lease.stopped == []
    assert warnings(caplog) == [NO_POOLS]


def test_run_engine_checks_each_wave_against_the_pools_it_is_given(db, cluster):
    run = cordon_uncordon(db, cluster)
    floor = {"train-a": PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 1,
                                                   "validate_timeout": "60s", "min_ready_gpus": 16})}

    run_engine(EngineSettings(control_check=dt.timedelta(0)), cluster, Watch(cluster), db, "engine-0",
               Script(nothing, nothing), lease=Lease(), pools=floor)

    # Two nodes of 8 GPUs and at least 16 Ready: gpu-01 may not go.
    assert run.state() == "running" and cluster.did() == []


def west_and_unnamed(db: Database, cluster) -> tuple[Any, Any]:
    """Two runs: gpu-01's on a request for cluster `west`, gpu-02's on one naming none
    (made before `clusters:` was configured). RequestService.submit takes no cluster, so
    the request's column is set by hand."""
    west = cordon_uncordon(db, cluster, nodes=("gpu-01",))
    unnamed = cordon_uncordon(db, cluster, nodes=("gpu-02",))
    request_id = next(r for r in stored_runs.unfinished(db) if r.id == west.run_id).request_id
    db.execute("UPDATE requests SET cluster = 'west' WHERE id = ?", (request_id,))
    return west, unnamed


def test_run_engine_drives_only_its_own_clusters_runs_and_away_from_home_not_those_naming_none(db, cluster):
    west, unnamed = west_and_unnamed(db, cluster)

    run_engine(EngineSettings(control_check=dt.timedelta(0)), cluster, Watch(cluster), db, "engine-0",
               threading.Event(), lease=Lease(), exit_when_idle=True, cluster="west", home=False)

    assert (west.state(), unnamed.state()) == ("succeeded", "pending")
    assert cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01")]


def test_run_engine_of_the_home_cluster_also_drives_the_runs_that_name_no_cluster(db, cluster):
    west, unnamed = west_and_unnamed(db, cluster)

    run_engine(EngineSettings(control_check=dt.timedelta(0)), cluster, Watch(cluster), db, "engine-0",
               threading.Event(), lease=Lease(), exit_when_idle=True, cluster="west")

    assert (west.state(), unnamed.state()) == ("succeeded", "succeeded")


def test_run_engine_reads_the_signals_and_the_service_health_it_is_given(db, cluster):
    run = cordon_uncordon(db, cluster, waves=[("gpu-01",), ("gpu-02",)])
    signals, prometheus = StandInSignals(), StandInPrometheus()
    watched = {"train-a": PoolConfig.model_validate({
        "kind": "training", "windows": "always", "max_unavailable": 1, "validate_timeout": "60s",
        "analysis": [{"name": "checkout-errors", "query": ERRORS, "max": 0.05, "for": "10m"}]})}

    run_engine(EngineSettings(control_check=dt.timedelta(0)), cluster, Watch(cluster), db, "engine-0",
               Script(nothing, nothing), lease=Lease(), pools=watched, health=prometheus, signals=signals)

    # gpu-01's signals read before and after its change; after its wave the pool's query
    # is read and must hold for 10 minutes before gpu-02 may start.
    assert [node for _, node in signals.reads][:2] == ["gpu-01", "gpu-01"]
    assert [query for _, query in prometheus.reads][:1] == [ERRORS]
    assert run.state() == "running" and cluster.did() == [("cordon", "gpu-01"), ("uncordon", "gpu-01")]


class GainedFirst(logging.Handler):
    """Holds `run_engine` at its warning about pools until its lease thread has said it
    holds the lease: the lease is gained before the engine exists. Keeps the lease's
    log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.gained = threading.Event()
        self.lease_lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "gpuops.lease":
            self.lease_lines.append(record.getMessage())
            self.gained.set()
        elif record.getMessage() == NO_POOLS:
            self.gained.wait(timeout=5)


@pytest.mark.timeout(10)
def test_a_lease_gained_before_the_engine_exists_is_held_and_the_engine_still_runs(db, cluster):
    run = cordon_uncordon(db, cluster)
    api = LeaseApi(cluster)
    handler = GainedFirst()
    loggers = [logging.getLogger("gpuops.lease"), logging.getLogger(ENGINE_LOG)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        run_engine(EngineSettings(lease=LeaseSettings(namespace="ops", name="gpuops-engine-test"),
                                  control_check=dt.timedelta(0)),
                   api, Watch(cluster), db, "engine-0", threading.Event(), exit_when_idle=True)
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)

    assert handler.lease_lines[:1] == ["engine-0 holds lease ops/gpuops-engine-test"]
    assert run.state() == "succeeded" and api.record is not None and api.record.holder is None
