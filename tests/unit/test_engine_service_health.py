"""Service health between waves, as the real engine runs a two-wave drain over an
in-memory cluster under a frozen clock (freezegun): after the first wave the pool's
`analysis` queries are read until their `for` has passed, and only then does the second
wave start; a query past its bound, or one that cannot be read, halts the run before the
second wave with the query and its value in the thread; an engine that restarts mid-watch
waits from when the watch began, not from its own start. The queries are read through a
stand-in for Prometheus (the real one: tests/e2e/test_service_health_prometheus.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable, Iterator

import pytest
from freezegun import freeze_time

from commands.drain_grammar import read_drain_words
from storage import runs as stored_runs
from storage.database import Database
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.drain.plan import drain_spec, plan_drain
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService
from workflows.fleet.pods import group_pods_by_node
from workflows.requests.service import RequestService
from workflows.prometheus.samples import Sample
from workflows.signals.analysis import QueryReading, breaches, reading_of

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
NODES = ("gpu-01", "gpu-02")
ERRORS = 'sum(rate(http_requests_total{code=~"5.."}[1m])) / sum(rate(http_requests_total[1m]))'
LATENCY = "histogram_quantile(0.99, sum by (le) (rate(request_seconds_bucket[1m])))"


def config(analysis: list[dict[str, object]]) -> GpuopsConfig:
    # One node out at a time: gpu-01 and gpu-02 go in two waves.
    return GpuopsConfig.model_validate({
        "signals": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
        "pools": {"serve-a": {"kind": "training", "windows": "always", "max_unavailable": 1,
                              "validate_timeout": "60s", "analysis": analysis}},
        "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
    })


GATED = config([{"name": "checkout-errors", "query": ERRORS, "max": 0.05, "for": "10m"},
                {"name": "p99-latency", "query": LATENCY, "max": 0.5, "for": "5m"}])


class StandInPrometheus:
    """Answers each query with the value a test sets (or why it cannot), counting reads."""

    def __init__(self) -> None:
        self.values: dict[str, QueryReading] = {ERRORS: QueryReading(value=0.01), LATENCY: QueryReading(value=0.2)}
        self.reads: list[tuple[dt.datetime, str]] = []

    def read(self, query: str) -> QueryReading:
        self.reads.append((dt.datetime.now(dt.timezone.utc), query))
        return self.values[query]


@pytest.fixture
def cluster(fake_cluster, make):
    for node in NODES:
        fake_cluster.add_node(make.node(node, pool="serve-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


@pytest.fixture
def frozen() -> Iterator[object]:
    with freeze_time(NOW, ignore=["kubernetes"]) as clock:
        yield clock


class Drain:
    """`/gpu drain gpu-01 gpu-02` on serve-a (no approval needed), its run started, an
    engine driven pass by pass while the frozen clock moves."""

    def __init__(self, db: Database, cluster, frozen, prometheus: StandInPrometheus | None,
                 cfg: GpuopsConfig = GATED, signals: object = None) -> None:
        self.db, self.cluster, self.frozen, self.prometheus, self.cfg = db, cluster, frozen, prometheus, cfg
        self.signals = signals  # reads each node's DCGM signals before and after its change
        fleet = cluster.fleet(NOW)
        spec = drain_spec(read_drain_words("gpu-01 gpu-02 now firmware".split(), fleet=fleet, pools=cfg.pools,
                                           now=NOW), fleet=fleet, pools=cfg.pools, now=NOW)
        plan = plan_drain(spec, fleet=fleet, pods_by_node=group_pods_by_node([]), policy=cfg.pools["serve-a"],
                          open_requests=(), now=NOW, requested_by="U0ADA").plan
        assert [w.nodes for w in plan.waves] == [("gpu-01",), ("gpu-02",)]
        # Without the hold (an open drain holds until `drain done`): each node goes straight back.
        plan = dataclasses.replace(plan, waves=tuple(dataclasses.replace(w, steps=tuple(
            s for s in w.steps if s.kind != "hold")) for w in plan.waves))
        ada = cfg.actor("U0ADA")
        request = RequestService(db, cfg).submit(ada, kind="drain", pool="serve-a", targets=list(spec.nodes),
                                                 plan=plan, window_start=spec.start, window_end=spec.end,
                                                 reason="firmware", channel="C0OPS", now=NOW)
        self.run_id = RunService(db).start(request.id, dry_run=False, now=NOW, actor=ada).id
        self.restart()

    def restart(self) -> None:
        """A new engine process: it remembers nothing but the database."""
        self.engine = Engine(db=self.db, gateway=self.cluster, cache=self.cluster, lease=AlwaysHeld(),
                             replica="engine-0", pools=self.cfg.pools, health=self.prometheus,
                             signals=self.signals,  # type: ignore[arg-type]
                             monotonic=lambda: dt.datetime.now(dt.timezone.utc).timestamp())

    def drive(self, until: Callable[[], bool], *, step_s: float = 5, passes: int = 2000) -> None:
        for _ in range(passes):
            if until():
                return
            self.engine.run_pass(set(NODES))
            self.frozen.tick(dt.timedelta(seconds=step_s))  # type: ignore[attr-defined]
        assert until(), self.run()

    def run(self) -> stored_runs.Run:
        run = stored_runs.get(self.db, id=self.run_id)
        assert run is not None
        return run

    def step(self, node: str, kind: str) -> str:
        return next(s.state for s in RunService(self.db).get(self.run_id).steps if (s.node, s.kind) == (node, kind))

    def ended(self, node: str, kind: str) -> dt.datetime:
        step = next(s for s in RunService(self.db).get(self.run_id).steps if (s.node, s.kind) == (node, kind))
        assert step.ended_at is not None, step
        return step.ended_at

    def started(self, node: str) -> bool:
        """A halted run skips what it never started."""
        return self.step(node, "cordon") not in ("pending", "skipped")

    def finished(self) -> bool:
        return self.run().state in ("succeeded", "failed", "aborted")

    def thread(self, event: str) -> list[str]:
        rows = self.db.query("SELECT payload FROM outbox ORDER BY id")
        return [p["text"] for p in (json.loads(r["payload"]) for r in rows) if p["event"] == event]

    def halt_code(self) -> str | None:
        rows = self.db.query("SELECT detail FROM audit WHERE action = 'run.failed'")
        return json.loads(rows[-1]["detail"]).get("code") if rows else None


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def test_the_next_wave_starts_only_once_every_query_held_for_its_for(db, cluster, frozen):
    prometheus = StandInPrometheus()
    drain = Drain(db, cluster, frozen, prometheus)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    done = now()
    drain.drive(lambda: drain.started("gpu-02"))

    assert now() >= done + dt.timedelta(minutes=10)  # the longest `for`
    assert now() <= done + dt.timedelta(minutes=11)
    (watching,) = drain.thread("run.health")
    assert "Wave 1 of 2 done" in watching and "checkout-errors at most 0.05 for 10m" in watching
    assert "p99-latency at most 0.5 for 5m" in watching
    (held,) = drain.thread("run.health.held")
    assert "checkout-errors 0.01" in held and "p99-latency 0.2" in held
    # Read all along, not once at the end; the latency query no more once its 5m passed.
    errors_reads = [at for at, q in prometheus.reads if q == ERRORS]
    latency_reads = [at for at, q in prometheus.reads if q == LATENCY]
    began = min(errors_reads)
    assert len(errors_reads) >= 10 and max(errors_reads) >= began + dt.timedelta(minutes=10)
    assert max(latency_reads) < began + dt.timedelta(minutes=6)

    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert len(drain.thread("run.health")) == 1  # the last wave earns nothing after it


def test_a_query_past_its_bound_halts_the_run_before_the_next_wave_with_the_query_and_its_value(
        db, cluster, frozen):
    prometheus = StandInPrometheus()
    drain = Drain(db, cluster, frozen, prometheus)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    drain.drive(lambda: now() >= NOW + dt.timedelta(minutes=3) and bool(drain.thread("run.health")))
    prometheus.values[ERRORS] = QueryReading(value=0.125)
    drain.drive(drain.finished)

    run = drain.run()
    assert run.state == "failed"
    assert "checkout-errors read 0.125, above its max 0.05" in (run.halted_reason or "")
    assert ERRORS in (run.halted_reason or "")
    (halt,) = drain.thread("run.failed")
    assert "checkout-errors read 0.125" in halt and ERRORS in halt
    assert drain.halt_code() == "service-unhealthy"
    assert not drain.started("gpu-02") and not cluster.node("gpu-02").unschedulable


def test_a_query_that_cannot_be_read_halts_the_run_it_never_passes(db, cluster, frozen):
    prometheus = StandInPrometheus()
    prometheus.values[LATENCY] = QueryReading(unread="the query answered no series (is the service still reporting?)")
    drain = Drain(db, cluster, frozen, prometheus)
    drain.drive(drain.finished)

    run = drain.run()
    assert run.state == "failed"
    assert "could not be read after wave 1" in (run.halted_reason or "")
    assert "p99-latency: the query answered no series" in (run.halted_reason or "")
    assert drain.halt_code() == "service-health-unread"
    assert not drain.started("gpu-02")


def test_without_a_prometheus_to_read_them_the_queries_halt_the_run(db, cluster, frozen):
    drain = Drain(db, cluster, frozen, None)
    drain.drive(drain.finished)
    assert drain.run().state == "failed"
    assert "signals.prometheus" in (drain.run().halted_reason or "")
    assert not drain.started("gpu-02")


def test_an_engine_that_restarts_mid_watch_waits_from_when_the_watch_began(db, cluster, frozen):
    prometheus = StandInPrometheus()
    drain = Drain(db, cluster, frozen, prometheus)
    drain.drive(lambda: bool(drain.thread("run.health")))
    began = now()
    drain.drive(lambda: now() >= began + dt.timedelta(minutes=7))
    drain.restart()
    drain.drive(lambda: drain.started("gpu-02"))

    assert began + dt.timedelta(minutes=10) <= now() <= began + dt.timedelta(minutes=11)
    assert len(drain.thread("run.health")) == 1  # not told again


def test_health_that_held_is_audited_once_while_the_capacity_gate_keeps_the_next_wave_waiting(db, cluster, frozen):
    prometheus = StandInPrometheus()
    drain = Drain(db, cluster, frozen, prometheus)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    # Someone cordons gpu-01 by hand during the watch: with it out, gpu-02 would make two.
    cluster.nodes["gpu-01"] = dataclasses.replace(cluster.node("gpu-01"), unschedulable=True)
    drain.drive(lambda: bool(drain.thread("run.waiting")))
    reads = len(prometheus.reads)
    waiting = now()
    drain.drive(lambda: now() >= waiting + dt.timedelta(minutes=5))  # passes, the wave still waiting
    assert not drain.started("gpu-02")
    drain.restart()  # a new engine finds the verdict in the audit
    drain.drive(lambda: now() >= waiting + dt.timedelta(minutes=6))
    cluster.nodes["gpu-01"] = dataclasses.replace(cluster.node("gpu-01"), unschedulable=False)
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    held = db.query("SELECT seq FROM audit WHERE action = 'run.health.held'")
    assert len(held) == 1  # the verdict, once: not again on every pass the wave waited, nor after a restart
    assert len(prometheus.reads) == reads  # and the queries are not read again for it


def test_a_pool_without_analysis_goes_straight_to_its_next_wave(db, cluster, frozen):
    prometheus = StandInPrometheus()
    drain = Drain(db, cluster, frozen, prometheus, cfg=config([]))
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    done = now()
    drain.drive(lambda: drain.started("gpu-02"))
    assert now() <= done + dt.timedelta(seconds=30)
    assert prometheus.reads == [] and drain.thread("run.health") == []


@pytest.mark.parametrize(("signals", "refusal"), [
    ({"exporters": {}}, "pools.serve-a.analysis needs signals.prometheus to read its queries: signals reads only "
                        "the exporters' pages"),
    (None, "pools.serve-a.analysis needs signals.prometheus to read its queries: signals is not configured"),
])
def test_analysis_without_a_prometheus_is_refused_at_start(tmp_path, signals, refusal):
    document = {"pools": {"serve-a": {"kind": "serving", "analysis": [
        {"name": "checkout-errors", "query": ERRORS, "max": 0.05, "for": "10m"}]}}}
    if signals is not None:
        document["signals"] = signals
    path = tmp_path / "gpuops.yaml"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refusal in str(refused.value)


@pytest.mark.parametrize(("query", "refusal"), [
    ({"name": "e", "query": "x"}, "give max (the highest value that passes) or min (the lowest), exactly one"),
    ({"name": "e", "query": "x", "max": 1, "min": 0}, "exactly one"),
    ({"name": "e", "query": "x", "max": 1, "for": "3h"}, "`for` must be between 0s and 2h"),
])
def test_an_analysis_query_needs_one_bound_and_a_for_of_at_most_two_hours(query, refusal):
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        config([query])



@pytest.mark.parametrize(("samples", "unread"), [
    ((), "answered no series"),
    ((Sample("a", {"svc": "x"}, 0.1), Sample("a", {"svc": "y"}, 0.2)), "answered 2 series, not one number"),
    ((Sample("a", {}, math.nan),), "answered NaN"),
    ((Sample("a", {}, math.nan, problem="its value is 'x', not a number"),), "its value is 'x', not a number"),
])
def test_an_answer_that_is_not_one_number_is_unread_with_the_reason(samples, unread):
    reading = reading_of(samples)
    assert reading.value is None and unread in (reading.unread or "")


def test_one_number_is_read_and_judged_against_its_bound():
    assert reading_of((Sample("a", {}, 0.25),)) == QueryReading(value=0.25)
    assert breaches(0.06, max_value=0.05, min_value=None) and not breaches(0.05, max_value=0.05, min_value=None)
    assert breaches(0.98, max_value=None, min_value=0.99) and not breaches(0.99, max_value=None, min_value=0.99)


def _planned(cluster, cfg: GpuopsConfig, words: str):
    fleet = cluster.fleet(NOW)
    spec = drain_spec(read_drain_words(words.split(), fleet=fleet, pools=cfg.pools, now=NOW), fleet=fleet,
                      pools=cfg.pools, now=NOW)
    return plan_drain(spec, fleet=fleet, pods_by_node=group_pods_by_node([]), policy=cfg.pools["serve-a"],
                      open_requests=(), now=NOW, requested_by="U0ADA").plan


def test_the_plan_lists_the_gates_for_the_approver(cluster):
    signals, note = [n for n in _planned(cluster, GATED, "gpu-01 gpu-02 now firmware").summary.preflight
                     if n.check == "gates"]
    assert signals.code == "gpu-signals-compared" and "read (Prometheus) before it is cordoned" in signals.sentence
    assert note.code == "health-between-waves"
    assert "1 wait of up to 10m" in note.sentence and "halts the run before the next wave" in note.sentence
    assert note.details == (f"checkout-errors: at most 0.05 for 10m ({ERRORS})",
                            f"p99-latency: at most 0.5 for 5m ({LATENCY})")

    _, alone = [n for n in _planned(cluster, GATED, "gpu-01 now firmware").summary.preflight if n.check == "gates"]
    assert alone.code == "health-one-wave" and "not asked" in alone.sentence
    assert [n.code for n in _planned(cluster, config([]), "gpu-01 gpu-02 now firmware").summary.preflight
            if n.check == "gates"] == ["gpu-signals-compared"]


def test_where_signals_are_not_configured_the_plan_says_that_gate_is_off(cluster):
    bare = GpuopsConfig.model_validate({"pools": {"serve-a": {"kind": "training", "windows": "always",
                                                              "max_unavailable": 1}}})
    (off,) = [n for n in _planned(cluster, bare, "gpu-01 now firmware").summary.preflight if n.check == "gates"]
    assert off.code == "gpu-signals-off" and "that gate is off" in off.sentence
