"""What the engine hands a step's logic for one look at it (`EngineStepContext`,
workflows/engine/context.py), shown by what the step then does or says: the real engine
runs plans written out here over the in-memory cluster, pass by pass, on a clock the test
moves (the harness of test_safety_rules.py).

- A hold with no end of its own holds until the request's window ends, writes that end in
  the display zone, and tells the thread how to extend that very request.
- An evict step that names no scope empties the node of every pod in a drain's plan.
- A param the step cannot use halts the run, and the reason names the step's kind.
- A dry run's uncordon answers from what this node's own cordon step found: not from
  another node's cordon, not from another of its steps, not from the node as it is now.
  A schedulable node still carrying a finished run's mark is forecast as given back, as
  the real run gives it back.
- A GPU evict step that watches for returning pods is done `RETURN_SETTLE` after it
  recorded that they were gone, not later.

And, where the step contract (workflows/engine/steps/contract.py) is what the context
promises: the node is read from the watch cache as of the engine's clock; a step being
prepared has no limit yet (no timeout, no deadline, not expired); its params come
decoded as the record its logic names; "the earlier step of a kind" never means itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from test_safety_rules import NOW, PlannedRun, cluster, hand_cordon, node_steps  # noqa: F401

from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.runs import Run
from storage.step_params import HoldParams
from storage.steps import Step
from workflows.engine import run_messages
from workflows.engine.context import EngineStepContext, LiveStep, RunInfo
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine, EngineSettings
from workflows.engine.runs import WAITING, RunService, step_intent, step_note
from workflows.engine.steps.eviction import RETURN_SETTLE
from workflows.kube.objects import Placement, Toleration
from workflows.plans import NodeStep, plan_from_json

BERLIN = ZoneInfo("Europe/Berlin")
WINDOW_END = NOW + dt.timedelta(minutes=30)  # 12:30 UTC, 14:30 in Berlin


def _steps(*middle: tuple[str, dict[str, Any]]) -> Callable[[str], tuple[NodeStep, ...]]:
    """Each node's plan: cordon, the `middle` steps (kind, params), uncordon."""
    return lambda node: (NodeStep("cordon", node, {}), *(NodeStep(kind, node, params) for kind, params in middle),  # type: ignore[arg-type]
                         NodeStep("uncordon", node, {}))  # type: ignore[arg-type]


def _run(planned: PlannedRun) -> Run:
    run = stored_runs.get(planned.db, id=planned.run_id)
    assert run is not None
    return run


def _step(planned: PlannedRun, node: str, kind: str) -> Step:
    return next(s for s in stored_steps.for_run(planned.db, run_id=planned.run_id) if (s.node, s.kind) == (node, kind))


def _finished(planned: PlannedRun) -> bool:
    return _run(planned).finished


def _context(planned: PlannedRun, node: str, kind: str) -> EngineStepContext:
    """The context the engine gives `node`'s `kind` step of the run, as it is stored now."""
    run = _run(planned)
    request = stored_requests.get(planned.db, id=run.request_id)
    assert request is not None
    info = RunInfo(request=request, plan=plan_from_json(request.plan))
    steps = stored_steps.for_run(planned.db, run_id=run.id)
    step = _step(planned, node, kind)
    return EngineStepContext(planned.engine, run, info, step, LiveStep(step_id=step.id), steps,
                             intent=step_intent(step))


# ------------------------------------------------------------------ a hold to the window's end


def test_a_hold_without_an_end_of_its_own_holds_to_the_windows_end_in_the_display_zone_and_names_the_request(
        db, cluster):  # noqa: F811
    planned = PlannedRun(db, cluster, [("gpu-01",)], steps=_steps(("hold", {})), window_end=WINDOW_END)
    planned.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                            settings=EngineSettings(display_zone=BERLIN), clock=lambda: planned.now,
                            monotonic=lambda: planned.mono)
    request_id = _run(planned).request_id

    planned.drive(lambda: bool(audit.for_run(db, planned.run_id, actions=("step.window-ending",))))

    # 15 minutes before the end the thread hears it once, with the words to ask for more.
    (told,) = audit.for_run(db, planned.run_id, actions=("step.window-ending",))
    assert told.at == WINDOW_END - dt.timedelta(minutes=15)
    assert told.detail["text"] == (  # type: ignore[index, call-overload]
        "The drain window ends at 2025-06-07 14:30:00 CEST: the nodes are then validated and uncordoned. "
        f"Need longer? `/gpu drain extend {request_id} <duration>`")
    hold = _step(planned, "gpu-01", "hold")
    assert hold.state == "running"
    assert hold.detail[WAITING] == "holding until 2025-06-07 14:30:00 CEST"  # type: ignore[index, call-overload]

    planned.drive(lambda: _finished(planned))

    hold = _step(planned, "gpu-01", "hold")
    assert _run(planned).state == "succeeded"
    assert hold.ended_at == WINDOW_END
    assert step_note(hold) == "held until 2025-06-07 14:30:00 CEST"


# ------------------------------------------------------------------ a drain's evict step


def test_an_evict_step_of_a_drains_plan_that_names_no_scope_evicts_every_pod_not_only_gpu_pods(
        db, cluster, make):  # noqa: F811
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01"), uid="uid-job-01")
    web = make.pod(node="gpu-01", name="web-01", namespace="ml", owner_kind="ReplicaSet", image="nginx:1.27")
    cluster.add_pod(web, uid="uid-web-01")  # uses no GPU
    planned = PlannedRun(db, cluster, [("gpu-01",)], steps=_steps(("evict", {})))

    planned.drive(lambda: _finished(planned))

    assert _run(planned).state == "succeeded"
    assert sorted(target for _, target in cluster.did("evict")) == ["ml/job-01", "ml/web-01"]
    assert step_intent(_step(planned, "gpu-01", "evict"))["scope"] == "all"


# ------------------------------------------------------------------ a param the step cannot use


def test_a_step_whose_timeout_cannot_be_used_halts_the_run_naming_the_steps_kind(db, cluster):  # noqa: F811
    planned = PlannedRun(db, cluster, [("gpu-01",)],
                         steps=lambda node: (NodeStep("cordon", node, {"timeout_s": 0}),))

    planned.drive(lambda: _finished(planned))

    run = _run(planned)
    assert run.state == "failed"
    assert run.halted_reason is not None and run_messages.bad_params(
        "cordon step: params.timeout_s must be more than 0, not 0") in run.halted_reason
    assert cluster.did("cordon", "annotate") == []


# ------------------------------------------------------------------ a dry run's uncordon


def test_a_dry_runs_uncordon_answers_from_its_own_nodes_cordon_step_not_another_step_or_the_node_now(
        db, cluster):  # noqa: F811
    """gpu-02 was cordoned by a person before the dry run; gpu-01 was schedulable, and a
    person cordons it right after the dry run's cordon of it. A real run would have
    cordoned gpu-01 itself and would give it back; gpu-02 it would leave cordoned."""
    hand_cordon(cluster, "gpu-02")
    dry_cordon = cluster.cordon_node

    def then_a_person_cordons_it(name: str, **kwargs: Any) -> Any:
        found = dry_cordon(name, **kwargs)
        hand_cordon(cluster, name)
        return found

    cluster.cordon_node = then_a_person_cordons_it
    planned = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], dry_run=True)

    planned.drive(lambda: _finished(planned))

    assert _run(planned).state == "succeeded"
    assert step_note(_step(planned, "gpu-01", "uncordon")) == "would uncordon it"
    assert step_note(_step(planned, "gpu-02", "uncordon")) == (
        "stays cordoned: it was cordoned before this run; only gpuops' mark was removed")
    assert [w.args["dry_run"] for w in cluster.writes] == [True] * len(cluster.writes)


def test_a_dry_run_forecasts_the_uncordon_of_a_schedulable_node_that_still_carries_a_finished_runs_mark(
        db, cluster):  # noqa: F811
    first = PlannedRun(db, cluster, [("gpu-01",)], steps=lambda n: node_steps(n, hold_s=3600))
    first.drive(lambda: cluster.node("gpu-01").unschedulable)
    RunService(db).abort(first.cfg.actor("U0ADA"), first.run_id, now=first.now)
    cluster.nodes["gpu-01"] = dataclasses.replace(cluster.node("gpu-01"), unschedulable=False)  # kubectl uncordon
    dry = PlannedRun(db, cluster, [("gpu-01",)], dry_run=True)
    dry.drive(lambda: _finished(dry))
    assert step_note(_step(dry, "gpu-01", "cordon")) == "would cordon it (it was schedulable)"

    assert step_note(_step(dry, "gpu-01", "uncordon")) == "would uncordon it"


# ------------------------------------------------------------------ pods that may come back


def test_a_gpu_evict_step_is_done_exactly_when_the_watch_for_returning_pods_on_record_ends(
        db, cluster, make):  # noqa: F811
    cordon_proof = Placement(tolerations=(Toleration(key="node.kubernetes.io/unschedulable", operator="Exists",
                                                     value="", effect=""),))
    job = dataclasses.replace(make.workload("gpu-01", gpus=8, name="job-01"), placement=cordon_proof)
    cluster.add_pod(job, uid="uid-job-01")
    planned = PlannedRun(db, cluster, [("gpu-01",)], steps=_steps(("evict", {"scope": "gpu"})))

    planned.drive(lambda: _finished(planned))

    assert _run(planned).state == "succeeded"
    (gone,) = audit.for_run(db, planned.run_id, actions=("pods.gone",))
    assert _step(planned, "gpu-01", "evict").ended_at == gone.at + RETURN_SETTLE


# ------------------------------------------------------------------ what the context promises


class _WatchCache:
    """The watch cache as the engine reads it (`NodeSource`), noting when each read is for."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.asked: list[dt.datetime] = []

    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None:
        return None

    def fleet(self, now: dt.datetime) -> Any:
        self.asked.append(now)
        return self.source.fleet(now)


def test_a_step_reads_its_node_from_the_watch_cache_as_of_the_engines_clock(db, cluster):  # noqa: F811
    planned = PlannedRun(db, cluster, [("gpu-01",)])
    watch = _WatchCache(cluster)
    planned.engine = Engine(db=db, gateway=cluster, cache=watch, lease=AlwaysHeld(), replica="engine-0",
                            clock=lambda: NOW + dt.timedelta(minutes=3), monotonic=lambda: planned.mono)

    inventory = _context(planned, "gpu-01", "hold").node_inventory()

    assert inventory is not None and inventory.name == "gpu-01" and inventory.cordoned is False
    assert watch.asked == [NOW + dt.timedelta(minutes=3)]


def test_a_step_being_prepared_has_no_limit_yet_and_its_params_come_decoded(db, cluster):  # noqa: F811
    planned = PlannedRun(db, cluster, [("gpu-01",)])

    ctx = _context(planned, "gpu-01", "hold")

    assert (ctx.timeout, ctx.deadline, ctx.expired) == (None, None, False)
    assert ctx.params == HoldParams(seconds=60)


def test_the_earlier_step_of_a_kind_is_this_nodes_and_never_the_step_itself(db, cluster):  # noqa: F811
    planned = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=lambda n: node_steps(n, hold_s=3600))
    planned.drive(lambda: _step(planned, "gpu-02", "hold").state == "running")
    cordon = step_intent(_step(planned, "gpu-01", "cordon"))
    assert cordon == {"prior_unschedulable": False}

    assert _context(planned, "gpu-01", "uncordon").step_intent("cordon") == cordon
    assert _context(planned, "gpu-01", "cordon").step_intent("cordon") is None
    assert _context(planned, "gpu-01", "hold").step_intent("hold") is None
