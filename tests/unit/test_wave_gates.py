"""The gates before a run's next node or wave (workflows.engine.wave_gates), as the real
engine meets them when it is built with the pools' policies: a two-wave drain of gpu-01
and gpu-02 on train-a (four nodes, one out at a time), over an in-memory cluster, on a
clock the test moves. What a person would notice is asserted, to the word of the message
functions: what `runs.waiting` says, what the run's thread is told (and how often), what
the audit log keeps, and whether the run goes on, waits or halts with which code.

- Before each wave the pool is checked as it is now: a wave that does not fit waits and
  says why, once per wave and rule; the run halts when the window ends first; a dry run says
  so and goes on.
- A change freeze stops the run at the next node boundary, told once per freeze (after
  a restart too) and again when the run goes on; a run it holds past its window halts.
- Between waves the pool's service health is read through a local HTTP stand-in for
  Prometheus (tests/hostile_sources.StandIn) with gpuops's own client: it must hold for
  its `for`, a breach or an unreadable query halts the run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from commands.drain_grammar import read_drain_words
from storage import audit
from storage import requests as stored_requests
from storage import steps as stored_steps
from storage.ids import RunId
from tests.hostile_sources import StandIn, Wire, answer, silent, vector
from tests.unit.test_engine_safety import Clock
from tests.unit.test_engine_service_health import ERRORS, LATENCY
from tests.unit.test_engine_service_health import Drain as ServiceHealthDrain
from workflows.config import GpuopsConfig
from workflows.drain.plan import drain_spec, plan_drain
from workflows.engine import halt_messages, run_messages
from workflows.engine import health_messages as health_say
from workflows.engine.context import RunInfo
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService
from workflows.engine.wave_gates import WaveGates, health_poll_every
from workflows.fleet.pods import group_pods_by_node
from workflows.plans import plan_from_json
from workflows.pools import messages as gate_say
from workflows.pools.config import PoolConfig
from workflows.pools.freezes import Freeze, FreezeService
from workflows.prometheus.client import Endpoint
from workflows.requests.service import RequestService
from workflows.signals import messages as signal_say
from workflows.signals.analysis import PrometheusHealth

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)  # a Saturday
UTC = dt.timezone.utc
POOL = "train-a"
POOL_NODES = ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
WORDS = "gpu-01 gpu-02 for 2h firmware"  # its window ends at 14:00
WINDOW_END = NOW + dt.timedelta(hours=2)
CONFIG = GpuopsConfig.model_validate({
    "pools": {POOL: {"kind": "training", "windows": "always", "max_unavailable": 1, "validate_timeout": "60s"}},
    "access": {"users": {"U0ADA": ["admin"]}, "names": {"U0ADA": "Ada"}},
})
ADA = CONFIG.actor("U0ADA")
JOB = "uid-job-01"  # gpu-01's GPU job: it terminates only when the test says so


def policy(**rules: Any) -> dict[str, PoolConfig]:
    """train-a's policy as the engine reads it, with `rules` changed."""
    return {POOL: PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 1,
                                             "validate_timeout": "60s", **rules})}


ANALYSIS = [{"name": "checkout-errors", "query": ERRORS, "max": 0.05, "for": "10m"},
            {"name": "p99-latency", "query": LATENCY, "max": 0.5, "for": "5m"}]


@pytest.fixture
def cluster(fake_cluster, make):
    for node in POOL_NODES:
        fake_cluster.add_node(make.node(node, pool=POOL))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    fake_cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01"), uid=JOB)
    fake_cluster.slow.add(JOB)
    return fake_cluster


class GatedDrain(ServiceHealthDrain):
    """`/gpu drain gpu-01 gpu-02 for 2h firmware` on train-a (planned against CONFIG, so
    one node a wave; each node straight back, without the hold), its run started; then
    engines built WITH the pools' policies `pools` (and `health`), driven pass by pass on
    a clock the test moves (`drive` ticks it)."""

    def __init__(self, db, cluster, *, pools: Mapping[str, PoolConfig] | None = None,
                 health: PrometheusHealth | None = None, words: str = WORDS, dry_run: bool = False) -> None:
        self.db, self.cluster, self.cfg = db, cluster, CONFIG
        self.pools = policy() if pools is None else pools
        self.health, self.prometheus, self.signals = health, None, None
        self.clock = Clock()
        self.frozen = self  # what the inherited `drive` ticks
        self.run_id = self.submit(words, dry_run=dry_run)
        self.restart()

    def request(self, words: str) -> str:
        """Another request on the pool (no approval needed: it is approved at once)."""
        now = self.clock.now
        fleet = self.cluster.fleet(now)
        spec = drain_spec(read_drain_words(words.split(), fleet=fleet, pools=CONFIG.pools, now=now), fleet=fleet,
                          pools=CONFIG.pools, now=now)
        plan = plan_drain(spec, fleet=fleet, pods_by_node=group_pods_by_node([]), policy=CONFIG.pools[POOL],
                          open_requests=(), now=now, requested_by="U0ADA").plan
        plan = dataclasses.replace(plan, waves=tuple(dataclasses.replace(w, steps=tuple(
            s for s in w.steps if s.kind != "hold")) for w in plan.waves))
        return RequestService(self.db, CONFIG).submit(ADA, kind="drain", pool=POOL, targets=list(spec.nodes), plan=plan,
                                                      window_start=spec.start, window_end=spec.end, reason="firmware",
                                                      channel="C0OPS", now=now).id

    def submit(self, words: str, *, dry_run: bool = False) -> RunId:
        """Another request on the pool, its run started."""
        return RunService(self.db).start(self.request(words), dry_run=dry_run, now=self.clock.now, actor=ADA).id

    def restart(self) -> None:
        self.engine = self.engine_with()

    def engine_with(self, **parts: Any) -> Engine:
        """A fresh engine over this drain's database, cluster and clock; `parts` replace
        what a test changes (its gateway, database, settings)."""
        return Engine(**{"db": self.db, "gateway": self.cluster, "cache": self.cluster, "lease": AlwaysHeld(),
                         "replica": "engine-0", "clock": lambda: self.clock.now,
                         "monotonic": lambda: self.clock.mono, "pools": self.pools, "health": self.health,
                         **parts})

    def tick(self, by: dt.timedelta) -> None:
        self.clock.advance(by.total_seconds())

    def until(self, at: dt.datetime, *, coarse: bool = False) -> None:
        """Passes every 5s up to (not at) `at`; `coarse`: a minute apart until its last five."""
        if coarse:
            self.drive(lambda: self.clock.now >= at - dt.timedelta(minutes=5), step_s=60)
        self.drive(lambda: self.clock.now >= at)

    def waiting(self) -> str | None:
        return self.run().waiting

    def audited(self, action: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """The details of the run's `action` rows, without what every row carries."""
        return [{k: v for k, v in e.detail.items() if k not in ("replica", "dry_run")}
                for e in audit.for_run(self.db, RunId(run_id or self.run_id), actions=(action,))]

    def halt(self) -> dict[str, Any]:
        (halt,) = self.audited("run.failed")
        return halt

    def gates(self) -> WaveGates:
        """The gates as a fresh engine process has them (nothing remembered)."""
        return WaveGates(self.engine, self.pools, self.health)

    def looked_at(self) -> tuple[Any, RunInfo, list[Any]]:
        """The run, its request and plan, and its steps, as the engine reads them now."""
        run = self.run()
        request = stored_requests.get(self.db, id=run.request_id)
        assert request is not None
        return run, RunInfo(request=request, plan=plan_from_json(request.plan)), list(
            stored_steps.for_run(self.db, run_id=self.run_id))


def set_by_hand(cluster, node: str, *, unschedulable: bool = True) -> None:
    """A person cordons (or uncordons) a node of the pool outside any run."""
    cluster.nodes[node] = dataclasses.replace(cluster.node(node), unschedulable=unschedulable)


def too_many(wave: int, node: str, *, already: tuple[str, ...], concurrent: tuple[str, ...] = ()) -> str:
    """What a wave of `node` waits for when max_unavailable 1 is already spent."""
    return gate_say.wave_does_not_fit(wave, gate_say.too_many_unavailable(
        pool=POOL, nodes=(node,), pool_size=len(POOL_NODES), already=already, concurrent=concurrent,
        concurrent_nodes=len(concurrent), most_at_once=0, unavailable=2, allowed=1, max_unavailable="1"))


def set_freeze(db, target: str = POOL, *, until: dt.datetime, now: dt.datetime, reason: str = "incident 4711",
               let_running_finish: bool = False) -> Freeze:
    service = FreezeService(db, pools=[POOL], names={"U0ADA": "Ada"})
    return service.set(ADA, target=target, until=until, reason=reason, let_running_finish=let_running_finish,
                       now=now).freeze


def lift_freeze(db, target: str = POOL, *, now: dt.datetime) -> None:
    FreezeService(db, pools=[POOL], names={"U0ADA": "Ada"}).lift(ADA, target=target, reason="over", now=now)


def frozen_text(drain: GatedDrain, freeze: Freeze, *, in_flight: list[str]) -> str:
    return gate_say.run_frozen(run_id=drain.run_id, target=freeze.target, by="Ada", until=freeze.until,
                               reason=freeze.reason, in_flight=in_flight, zone=UTC)


def waits_for(freeze: Freeze) -> str:
    return gate_say.run_waits_for_freeze(target=freeze.target, by="Ada", until=freeze.until, reason=freeze.reason,
                                         zone=UTC)


def started_at(drain: GatedDrain, node: str) -> dt.datetime | None:
    return next(s.started_at for s in drain.looked_at()[2] if (s.node, s.kind) == (node, "cordon"))


# ------------------------------------------------------------------ the capacity gate before each wave


def test_a_wave_that_does_not_fit_waits_says_why_and_tells_the_thread_once_per_reason(db, cluster):
    # The pool allows drains from 12:30 only, and a person has cordoned gpu-03.
    late = [{"days": "daily", "start": "12:30", "end": "18:00", "timezone": "UTC"}]
    drain = GatedDrain(db, cluster, pools=policy(windows=late))
    set_by_hand(cluster, "gpu-03")
    cluster.terminate(JOB)
    outside = gate_say.wave_outside_windows(0, POOL)
    drain.until(NOW + dt.timedelta(minutes=29, seconds=55))  # some 360 passes

    assert drain.waiting() == outside
    assert drain.thread("run.waiting") == [outside]  # once, not at every pass
    assert drain.step("gpu-01", "cordon") == "pending"

    drain.until(NOW + dt.timedelta(minutes=40))
    full = too_many(0, "gpu-01", already=("gpu-03",))
    assert drain.waiting() == full
    assert drain.thread("run.waiting") == [outside, full]  # the reason changed: told again
    assert drain.audited("run.waiting") == [{"wave": 0, "rule": "window", "text": outside},
                                            {"wave": 0, "rule": "max_unavailable", "text": full}]
    assert drain.step("gpu-01", "cordon") == "pending"

    set_by_hand(cluster, "gpu-03", unschedulable=False)
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done", passes=2)
    assert drain.waiting() is None  # the wave fits: nothing to wait for any more
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert len(drain.thread("run.waiting")) == 2


def test_the_same_rule_in_other_words_is_kept_in_the_run_and_the_audit(db, cluster):
    drain = GatedDrain(db, cluster)
    set_by_hand(cluster, "gpu-03")
    drain.until(NOW + dt.timedelta(minutes=1))
    first = too_many(0, "gpu-01", already=("gpu-03",))
    set_by_hand(cluster, "gpu-03", unschedulable=False)
    set_by_hand(cluster, "gpu-04")
    drain.until(NOW + dt.timedelta(minutes=2))

    second = too_many(0, "gpu-01", already=("gpu-04",))
    assert drain.waiting() == second
    assert [a["text"] for a in drain.audited("run.waiting")] == [first, second]


def test_the_ready_gpu_floor_counts_the_pool_as_it_is_now(db, cluster):
    # Four nodes of 8 GPUs, two may be out, at least 24 Ready GPUs: with gpu-03 cordoned
    # by hand, taking gpu-01 out would leave 16.
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=2, min_ready_gpus=24))
    set_by_hand(cluster, "gpu-03")
    drain.until(NOW + dt.timedelta(minutes=1))

    floor = gate_say.wave_does_not_fit(0, gate_say.below_gpu_floor(
        pool=POOL, nodes=("gpu-01",), pool_size=4, already=("gpu-03",), concurrent=(), concurrent_nodes=0,
        most_at_once=0, ready_now=24, ready_during=16, floor=24))
    assert drain.waiting() == floor
    assert drain.thread("run.waiting") == [floor]
    assert drain.audited("run.waiting") == [{"wave": 0, "rule": "min_ready_gpus", "text": floor}]


def test_another_approved_request_on_the_pool_counts_against_the_budget(db, cluster):
    drain = GatedDrain(db, cluster)
    other = drain.request("gpu-03 for 2h firmware")  # approved, its run not started
    drain.until(NOW + dt.timedelta(minutes=1))

    held = too_many(0, "gpu-01", already=(), concurrent=(other,))
    assert drain.waiting() == held
    assert drain.thread("run.waiting") == [held]


def test_a_node_in_another_runs_current_wave_keeps_the_wave_waiting_until_that_run_is_done(db, cluster, make):
    cluster.add_pod(make.workload("gpu-02", gpus=8, name="job-02"), uid="uid-job-02")
    cluster.slow.add("uid-job-02")
    drain = GatedDrain(db, cluster, pools=policy(max_unavailable=2))
    other = drain.submit("gpu-02 for 2h firmware")  # on gpu-02, its job slow to go
    drain.drive(lambda: next(s.state for s in RunService(db).get(other).steps if s.kind == "evict") == "running")
    cluster.terminate(JOB)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    drain.until(drain.clock.now + dt.timedelta(minutes=2))

    busy = gate_say.wave_nodes_busy(1, {"gpu-02": other})
    assert drain.waiting() == busy
    assert drain.thread("run.waiting") == [busy]
    assert drain.audited("run.waiting") == [{"wave": 1, "rule": "busy", "text": busy}]
    assert drain.step("gpu-02", "cordon") == "pending"

    cluster.terminate("uid-job-02")
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason


def test_a_wave_of_a_pool_no_longer_configured_waits(db, cluster):
    drain = GatedDrain(db, cluster, pools={"train-b": policy()[POOL]})
    drain.until(NOW + dt.timedelta(minutes=1))
    gone = gate_say.pool_gone(0, POOL)
    assert drain.waiting() == gone
    assert drain.thread("run.waiting") == [gone]


def test_a_wave_still_waiting_when_the_window_ends_halts_the_run_before_it(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_by_hand(cluster, "gpu-03")  # while gpu-01 is under way: the second wave will not fit
    cluster.terminate(JOB)
    drain.until(WINDOW_END - dt.timedelta(seconds=5), coarse=True)
    assert drain.run().state == "running"
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))

    drain.drive(drain.finished, passes=2)  # the pass at the window's end
    reason = gate_say.wave_window_over(1, WINDOW_END, zone=UTC)
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.thread("run.failed") == [said]
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "window-ended", "left_cordoned": [], "text": said}
    assert not drain.started("gpu-02")
    assert drain.waiting() is None


def test_a_dry_run_says_a_wave_would_wait_and_goes_on(db, cluster):
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, dry_run=True)
    set_by_hand(cluster, "gpu-03")
    assert drain.gates().wave_may_start(*drain.looked_at(), 0)  # it would wait, and goes on
    assert drain.waiting() is None  # nothing to wait for
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert drain.thread("run.waiting") == [
        run_messages.dry_run_wave_would_wait(too_many(0, "gpu-01", already=("gpu-03",))),
        run_messages.dry_run_wave_would_wait(too_many(1, "gpu-02", already=("gpu-03",)))]


def test_a_dry_run_past_its_window_says_the_wave_would_not_start_and_goes_on(db, cluster):
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, dry_run=True, words="gpu-01 for 10m firmware")
    drain.clock.advance(11 * 60)
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    over = gate_say.wave_window_over(0, NOW + dt.timedelta(minutes=10), zone=UTC)
    assert drain.thread("run.waiting") == [run_messages.dry_run_wave_would_wait(over)]


def test_an_engine_that_took_the_lease_over_tells_the_wait_again(db, cluster):
    drain = GatedDrain(db, cluster)
    set_by_hand(cluster, "gpu-03")
    gates = drain.gates()
    assert not gates.wave_may_start(*drain.looked_at(), 0)
    assert not gates.wave_may_start(*drain.looked_at(), 0)
    assert len(drain.audited("run.waiting")) == 1
    gates.forget()  # the lease went to another replica and came back
    assert not gates.wave_may_start(*drain.looked_at(), 0)
    assert len(drain.audited("run.waiting")) == 2
    assert drain.waiting() == too_many(0, "gpu-01", already=("gpu-03",))


# ------------------------------------------------------------------ change freezes


@pytest.mark.parametrize("target", [POOL, "cluster"])
def test_a_freeze_stops_the_run_at_the_next_node_boundary_told_once_and_again_when_it_goes_on(db, cluster, target):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    until = NOW + dt.timedelta(hours=1)
    freeze = set_freeze(db, target, until=until, now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=5))

    told = frozen_text(drain, freeze, in_flight=["gpu-01"])
    assert drain.thread("run.frozen") == [told]
    assert drain.waiting() == waits_for(freeze)
    cluster.terminate(JOB)
    drain.until(drain.clock.now + dt.timedelta(minutes=10))
    assert drain.step("gpu-01", "uncordon") == "done"  # the node under way finished
    assert drain.step("gpu-02", "cordon") == "pending"  # no further wave started
    assert drain.audited("run.frozen") == [{"freeze": freeze.id, "freeze_target": target,
                                            "until": until.isoformat(), "in_flight": ["gpu-01"], "text": told}]

    lift_freeze(db, target, now=drain.clock.now)
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason
    unfrozen = gate_say.run_unfrozen(run_id=drain.run_id, target=target)
    assert drain.thread("run.unfrozen") == [unfrozen]
    assert drain.audited("run.unfrozen") == [{"freeze": freeze.id, "text": unfrozen}]
    assert len(drain.audited("run.frozen")) == 1


def test_a_freeze_that_ends_by_itself_lets_the_run_go_on_and_says_so(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=drain.clock.now + dt.timedelta(minutes=20), now=drain.clock.now)
    cluster.terminate(JOB)
    drain.until(freeze.until - dt.timedelta(seconds=5))
    assert drain.step("gpu-02", "cordon") == "pending"
    assert drain.waiting() == waits_for(freeze)

    drain.drive(lambda: drain.step("gpu-02", "cordon") != "pending", passes=2)
    assert drain.thread("run.unfrozen") == [gate_say.run_unfrozen(run_id=drain.run_id, target=POOL)]
    assert drain.waiting() is None


def test_a_freeze_replaced_by_another_is_told_again(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    first = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    second = set_freeze(db, until=NOW + dt.timedelta(hours=3), reason="incident 4712", now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))

    assert drain.thread("run.frozen") == [frozen_text(drain, first, in_flight=["gpu-01"]),
                                          frozen_text(drain, second, in_flight=["gpu-01"])]
    assert drain.waiting() == waits_for(second)
    assert drain.thread("run.unfrozen") == []


def test_a_freeze_between_waves_names_no_node_as_finishing_and_the_wait_it_interrupted_comes_back(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_by_hand(cluster, "gpu-03")
    cluster.terminate(JOB)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    full = too_many(1, "gpu-02", already=("gpu-03",))
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert drain.waiting() == full
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))

    assert drain.thread("run.frozen") == [frozen_text(drain, freeze, in_flight=[])]
    assert drain.waiting() == waits_for(freeze)
    lift_freeze(db, now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert drain.waiting() == full
    assert drain.thread("run.waiting") == [full]


def test_a_freeze_that_lets_running_runs_finish_does_not_stop_a_run_that_started(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now, let_running_finish=True)
    cluster.terminate(JOB)
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert drain.thread("run.frozen") == [] and drain.audited("run.frozen") == []


def test_a_freeze_that_lets_running_runs_finish_holds_a_run_that_has_not_started_a_step(db, cluster):
    drain = GatedDrain(db, cluster)
    set_by_hand(cluster, "gpu-03")  # the first wave waits: the run is running, no step started
    drain.until(NOW + dt.timedelta(minutes=1))
    assert drain.run().state == "running"
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now, let_running_finish=True)
    set_by_hand(cluster, "gpu-03", unschedulable=False)
    drain.until(NOW + dt.timedelta(minutes=5))

    assert drain.step("gpu-01", "cordon") == "pending"
    assert drain.thread("run.frozen") == [frozen_text(drain, freeze, in_flight=[])]
    assert drain.waiting() == waits_for(freeze)


def test_a_run_frozen_past_its_window_halts_once_no_node_is_under_way(db, cluster):
    drain = GatedDrain(db, cluster, words="gpu-01 gpu-02 for 20m firmware")
    end = NOW + dt.timedelta(minutes=20)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(end + dt.timedelta(minutes=3))
    assert drain.run().state == "running"  # gpu-01 is still under way: it finishes first

    cluster.terminate(JOB)
    drain.drive(drain.finished)
    reason = gate_say.run_window_ended_while_frozen(run_id=drain.run_id, target=POOL, window_end=end, zone=UTC)
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.halt() == {"wave": 0, "reason": reason, "code": "window-ended-while-frozen", "left_cordoned": [],
                            "text": said}
    assert drain.step("gpu-01", "uncordon") == "done" and not drain.started("gpu-02")
    assert drain.thread("run.frozen") == [frozen_text(drain, freeze, in_flight=["gpu-01"])]


def test_a_run_frozen_before_any_node_halts_at_its_windows_end_not_before(db, cluster):
    drain = GatedDrain(db, cluster, words="gpu-01 gpu-02 for 20m firmware")
    set_by_hand(cluster, "gpu-03")
    end = NOW + dt.timedelta(minutes=20)
    drain.until(NOW + dt.timedelta(minutes=1))
    set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(end - dt.timedelta(seconds=5))
    assert drain.run().state == "running"

    drain.drive(drain.finished, passes=2)
    assert drain.halt()["code"] == "window-ended-while-frozen"
    assert drain.step("gpu-01", "cordon") != "done"


def test_after_a_restart_the_freeze_already_told_is_not_told_again_and_its_end_is(db, cluster):
    drain = GatedDrain(db, cluster)
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    freeze = set_freeze(db, until=NOW + dt.timedelta(hours=1), now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    drain.restart()
    drain.until(drain.clock.now + dt.timedelta(minutes=1))
    assert len(drain.audited("run.frozen")) == 1  # the new engine read it back from the audit
    assert drain.waiting() == waits_for(freeze)

    drain.restart()
    lift_freeze(db, now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(seconds=10))
    assert drain.thread("run.unfrozen") == [gate_say.run_unfrozen(run_id=drain.run_id, target=POOL)]

    # The run went on since: a new engine does not take the old freeze for one in force,
    # and a new freeze is told.
    drain.restart()
    again = set_freeze(db, until=NOW + dt.timedelta(hours=2), reason="incident 4713", now=drain.clock.now)
    drain.until(drain.clock.now + dt.timedelta(seconds=10))
    assert [a["freeze"] for a in drain.audited("run.frozen")] == [freeze.id, again.id]
    assert len(drain.audited("run.unfrozen")) == 1


# ------------------------------------------------------------------ service health between waves


class LocalPrometheus:
    """A local HTTP stand-in for Prometheus (tests/hostile_sources.StandIn) answering each
    query with the body a test sets; gpuops reads it with its own client."""

    def __init__(self, served: StandIn) -> None:
        self.answers: dict[str, bytes] = {ERRORS: one(0.01), LATENCY: one(0.2)}
        self.served = served
        served.behave["127.0.0.1"] = self._answer
        self.health = PrometheusHealth(endpoint=Endpoint(url=f"http://127.0.0.1:{served.port}", timeout_seconds=5))

    def _answer(self, wire: Wire, path: str) -> None:
        answer(self.answers[asked(path)])(wire, path)

    def reads(self, query: str) -> int:
        return sum(1 for c in self.served.connections if asked(c.path) == query)


def asked(path: str) -> str:
    return parse_qs(urlsplit(path).query)["query"][0]


def one(value: float) -> bytes:
    return vector([{"metric": {}, "value": [1.7e9, "NaN" if math.isnan(value) else str(value)]}])


@pytest.fixture
def prometheus() -> Iterator[LocalPrometheus]:
    with StandIn(["127.0.0.1"], silent()) as served:
        yield LocalPrometheus(served)


def watching(*, dry_run: bool = False) -> str:
    checks = [("checkout-errors", health_say.bound_words(max_value=0.05, min_value=None), dt.timedelta(minutes=10)),
              ("p99-latency", health_say.bound_words(max_value=0.5, min_value=None), dt.timedelta(minutes=5))]
    return health_say.watching(after=1, waves=2, checks=checks, dry_run=dry_run)


def health_drain(db, cluster, prometheus: LocalPrometheus | None, *, analysis=ANALYSIS,
                 dry_run: bool = False) -> tuple[GatedDrain, dt.datetime]:
    """The drain on a pool with `analysis`, driven until its first wave is done: when."""
    cluster.terminate(JOB)
    drain = GatedDrain(db, cluster, pools=policy(analysis=analysis), dry_run=dry_run,
                       health=prometheus.health if prometheus is not None else None)
    drain.drive(lambda: drain.step("gpu-01", "uncordon") == "done")
    return drain, drain.ended("gpu-01", "uncordon")


def test_the_next_wave_starts_when_every_query_held_for_its_for_after_the_wave_ended(db, cluster, prometheus):
    drain, done = health_drain(db, cluster, prometheus)
    assert drain.thread("run.health") == [watching()]
    assert drain.audited("run.health") == [{"wave": 0, "queries": ["checkout-errors", "p99-latency"],
                                            "text": watching()}]
    drain.until(done + dt.timedelta(minutes=7))
    last_pass = drain.clock.now - dt.timedelta(seconds=5)
    assert drain.waiting() == health_say.waiting(after=1, left=done + dt.timedelta(minutes=10) - last_pass)
    assert not drain.started("gpu-02")

    drain.drive(lambda: drain.started("gpu-02"))
    assert started_at(drain, "gpu-02") == done + dt.timedelta(minutes=10)  # the longest `for`, to the pass
    held = health_say.held(after=1, values=[("checkout-errors", 0.01), ("p99-latency", 0.2)])
    assert drain.thread("run.health.held") == [held]
    assert drain.audited("run.health.held") == [{"wave": 0, "values": {"checkout-errors": 0.01, "p99-latency": 0.2},
                                                 "text": held}]
    # Read every 30s (a tenth of the shortest `for`), each until its own `for` passed.
    assert prometheus.reads(ERRORS) == 21 and prometheus.reads(LATENCY) == 11
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert len(drain.thread("run.health")) == 1


@pytest.mark.parametrize(("query", "value", "side"), [
    ({"name": "checkout-errors", "query": ERRORS, "max": 0.05, "for": "10m"}, 0.125, {"max_value": 0.05}),
    ({"name": "checkout-success", "query": ERRORS, "min": 0.99, "for": "10m"}, 0.98, {"min_value": 0.99}),
])
def test_a_query_past_its_bound_halts_the_run_with_its_name_query_and_value(db, cluster, prometheus, query, value,
                                                                             side):
    prometheus.answers[ERRORS] = one(0.995 if "min" in query else 0.01)
    drain, done = health_drain(db, cluster, prometheus, analysis=[query])
    drain.until(done + dt.timedelta(minutes=3))
    assert drain.run().state == "running"
    prometheus.answers[ERRORS] = one(value)
    drain.drive(drain.finished, passes=8)

    reason = health_say.failed(after=1, name=str(query["name"]), query=ERRORS, value=value,
                               **{"max_value": None, "min_value": None, **side})
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.thread("run.failed") == [said]
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "service-unhealthy", "query": query["name"],
                            "promql": ERRORS, "value": value, "left_cordoned": [], "text": said}
    assert not drain.started("gpu-02")


@pytest.mark.parametrize(("body", "unread"), [
    (vector([]), signal_say.analysis_no_series()),
    (vector([{"metric": {"svc": "a"}, "value": [1, "0.01"]}, {"metric": {"svc": "b"}, "value": [1, "0.02"]}]),
     signal_say.analysis_several_series(2)),
    (one(math.nan), signal_say.analysis_not_a_number()),
])
def test_a_query_that_cannot_be_read_halts_the_run_a_gate_that_cannot_see_fails_closed(db, cluster, prometheus,
                                                                                      body, unread):
    prometheus.answers[ERRORS] = body
    drain, done = health_drain(db, cluster, prometheus)
    drain.drive(drain.finished, passes=2)

    reason = health_say.unread(after=1, name="checkout-errors", query=ERRORS, reason=unread)
    said = halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.run().state == "failed" and drain.run().halted_reason == said
    assert drain.halt() == {"wave": 1, "reason": reason, "code": "service-health-unread", "query": "checkout-errors",
                            "promql": ERRORS, "unread": unread, "left_cordoned": [], "text": said}
    assert not drain.started("gpu-02")


def test_without_a_prometheus_the_pools_queries_halt_the_run(db, cluster):
    drain, done = health_drain(db, cluster, None)
    drain.drive(drain.finished, passes=2)

    reason = health_say.unread(after=1, name="checkout-errors", query=ERRORS, reason=health_say.no_reader())
    assert drain.run().halted_reason == halt_messages.halted_before_wave(reason, left_cordoned=())
    assert drain.halt()["code"] == "service-health-unread"


def test_an_engine_that_restarts_mid_watch_waits_from_when_the_watch_began(db, cluster, prometheus):
    drain, done = health_drain(db, cluster, prometheus)
    drain.until(done + dt.timedelta(minutes=7))
    drain.restart()
    drain.drive(lambda: drain.started("gpu-02"))

    assert started_at(drain, "gpu-02") == done + dt.timedelta(minutes=10)
    assert len(drain.audited("run.health")) == 1 and len(drain.thread("run.health")) == 1
    assert len(drain.audited("run.health.held")) == 1


def test_health_that_held_is_not_read_or_told_again_after_a_restart_while_the_wave_waits(db, cluster, prometheus):
    drain, done = health_drain(db, cluster, prometheus)
    set_by_hand(cluster, "gpu-03")  # during the watch: the next wave will not fit
    drain.until(done + dt.timedelta(minutes=11))
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))
    reads = prometheus.reads(ERRORS)
    drain.restart()
    drain.until(drain.clock.now + dt.timedelta(minutes=2))

    assert prometheus.reads(ERRORS) == reads
    assert len(drain.audited("run.health.held")) == 1 and len(drain.audited("run.health")) == 1
    assert drain.waiting() == too_many(1, "gpu-02", already=("gpu-03",))


def test_a_dry_run_says_what_it_would_watch_and_goes_on(db, cluster, prometheus):
    drain, done = health_drain(db, cluster, prometheus, dry_run=True)
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert drain.thread("run.health") == [watching(dry_run=True)]
    assert started_at(drain, "gpu-02") == done  # not a moment's wait
    assert prometheus.reads(ERRORS) == prometheus.reads(LATENCY) == 0
    assert drain.thread("run.health.held") == []


@pytest.mark.parametrize(("fors", "every"), [
    (["10m"], dt.timedelta(seconds=30)),
    (["10m", "20s"], dt.timedelta(seconds=2)),
    (["5s"], dt.timedelta(seconds=1)),
    (["0s"], dt.timedelta(seconds=1)),
])
def test_queries_are_read_a_tenth_of_the_shortest_for_between_1s_and_30s(fors, every):
    queries = policy(analysis=[{"name": f"q{i}", "query": "x", "max": 1, "for": f} for i, f in enumerate(fors)])
    assert health_poll_every(queries[POOL].analysis) == every
