"""Safety rules a one-line change could break with the rest of the suite still green:
each test here fails when its rule is broken. The real engine runs over the in-memory
cluster (tests/unit/fake_cluster.py), pass by pass, on a clock the test moves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

import pytest
from test_engine_safety import Drain, mark

from bot.wiring import check_permissions
from storage import audit
from storage import freezes as stored_freezes
from storage import runs as stored_runs
from storage.kube_events import kube_events_due
from storage.database import Database
from workflows.config import ConfigError, GpuopsConfig
from workflows.engine.cordons import Cordons, UncordonRefused
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunRefused, RunService
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def cluster(fake_cluster, make):
    """Ten nodes of train-a, each with its operand pods (gpu-01 ... gpu-10)."""
    for number in range(1, 11):
        node = f"gpu-{number:02d}"
        fake_cluster.add_node(make.node(node, pool="train-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


# ------------------------------------------------------------------ validation before giving a node back


def test_a_drained_node_whose_device_plugin_marks_a_gpu_unhealthy_is_not_given_back(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    # The device plugin marks one GPU unhealthy: capacity still 8, allocatable 7.
    node = cluster.node("gpu-01")
    cluster.nodes["gpu-01"] = dataclasses.replace(node, allocatable={**node.allocatable, "nvidia.com/gpu": "7"})

    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert drain.step("gpu-01", "validate") == "failed" and drain.step("gpu-01", "uncordon") == "skipped"
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert cluster.node("gpu-01").unschedulable and mark(cluster, "gpu-01")["run"] == drain.run_id  # type: ignore[index]


@pytest.mark.parametrize(("operand", "pod_of", "named"), [
    ("nvidia-operator-validator", "validator_pod", "validator"),  # its CUDA check fails
    ("nvidia-device-plugin-daemonset", "device_plugin_pod", "device plugin"),
    ("nvidia-driver-daemonset", "driver_pod", "driver pod"),
])
def test_a_drained_node_whose_operand_is_not_ready_is_not_given_back(db, cluster, make, operand, pod_of, named):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    (uid,) = [u for u, p in cluster.pods.items() if p.pod.node_name == "gpu-01" and p.pod.name.startswith(operand)]
    cluster.terminate(uid)
    cluster.add_pod(getattr(make, pod_of)("gpu-01", ready=False), uid=f"uid-{operand}-failing")

    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert named in (drain.run().halted_reason or "")
    assert drain.step("gpu-01", "validate") == "failed" and drain.step("gpu-01", "uncordon") == "skipped"
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert cluster.node("gpu-01").unschedulable


def test_a_drained_node_that_is_not_ready_is_not_given_back(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    cluster.nodes["gpu-01"] = dataclasses.replace(cluster.node("gpu-01"), ready=False)

    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert drain.step("gpu-01", "validate") == "failed" and drain.step("gpu-01", "uncordon") == "skipped"
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert cluster.node("gpu-01").unschedulable


# ------------------------------------------------------------------ runs of a plan written out here

NODES = tuple(f"gpu-{number:02d}" for number in range(1, 11))


def pool_config(*, max_unavailable: int = 10) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": max_unavailable,
                              "drain_timeout": "60s", "validate_timeout": "60s"}},
        "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
    })


def node_steps(node: str, hold_s: int = 60) -> tuple[NodeStep, ...]:
    return (NodeStep("cordon", node, {}), NodeStep("hold", node, {"seconds": hold_s}),  # type: ignore[arg-type]
            NodeStep("uncordon", node, {}))  # type: ignore[arg-type]


class PlannedRun:
    """A run of `waves` on train-a (`steps` per node: cordon, hold, uncordon unless
    told), approved and started; an engine (with the pools' policies when `gated`, reading
    `signals` when given) driven pass by pass."""

    def __init__(self, db: Database, cluster, waves: list[tuple[str, ...]], *, cfg: GpuopsConfig | None = None,
                 gated: bool = False, steps: Callable[[str], tuple[NodeStep, ...]] = node_steps,
                 dry_run: bool = False, window_end: dt.datetime | None = None, signals: object = None) -> None:
        self.db, self.cluster, self.now, self.mono = db, cluster, NOW, 0.0
        self.cfg = cfg or pool_config()
        plan = Plan(kind="drain", pool="train-a", summary=PlanSummary(), created_for="U0ADA", waves=tuple(
            Wave(index, nodes, tuple(s for node in nodes for s in steps(node)))  # type: ignore[arg-type]
            for index, nodes in enumerate(waves)))
        request = RequestService(db, self.cfg).submit(
            self.cfg.actor("U0ADA"), kind="drain", pool="train-a", targets=[n for w in waves for n in w], plan=plan,
            window_start=None, window_end=window_end, reason="rack move", channel="C0OPS", now=NOW)
        self.run_id = RunService(db).start(request.id, dry_run=dry_run, now=NOW, actor=self.cfg.actor("U0ADA")).id
        self.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                             clock=lambda: self.now, monotonic=lambda: self.mono,
                             pools=self.cfg.pools if gated else None,
                             signals=signals)  # type: ignore[arg-type]  # a stand-in reader of GPU signals

    def drive(self, until: Callable[[], bool], *, passes: int = 200) -> None:
        for _ in range(passes):
            if until():
                return
            self.engine.run_pass(set(NODES))
            self.now += dt.timedelta(seconds=5)
            self.mono += 5
        assert until(), RunService(self.db).get(self.run_id)

    def passes(self, count: int) -> None:
        for _ in range(count):
            self.engine.run_pass(set(NODES))
            self.now += dt.timedelta(seconds=5)
            self.mono += 5

    def state(self) -> str:
        run = stored_runs.get(self.db, id=self.run_id)
        assert run is not None
        return run.state

    def cordoned(self) -> list[str]:
        return [target for verb, target in self.cluster.did("cordon")]


def test_a_freeze_stops_the_nodes_of_the_wave_in_progress_that_have_not_started(db, cluster):
    run = PlannedRun(db, cluster, [NODES])  # one wave of ten; four nodes at once
    run.drive(lambda: len(run.cordoned()) == 4)
    stored_freezes.create(db, target="train-a", until=NOW + dt.timedelta(hours=6), reason="incident",
                          let_running_finish=False, set_by="U0BOB", set_by_name="Bob", at=run.now)

    run.passes(100)  # far longer than the four nodes under way take to finish

    assert run.cordoned() == list(NODES[:4])  # no node started after the freeze
    assert sorted(t for _, t in cluster.did("uncordon")) == list(NODES[:4])  # those under way finished
    assert not any(cluster.node(n).unschedulable for n in NODES)
    assert run.state() == "running"


# ------------------------------------------------------------------ one node, one run


def test_a_second_run_never_changes_a_node_another_unfinished_run_has_cordoned(db, cluster):
    first = PlannedRun(db, cluster, [("gpu-01",)])
    first.drive(lambda: first.cordoned() == ["gpu-01"])
    second = PlannedRun(db, cluster, [("gpu-01", "gpu-02")])

    second.drive(lambda: second.state() == "failed")

    reason = stored_runs.get(db, id=second.run_id).halted_reason  # type: ignore[union-attr]
    assert "gpu-01" in (reason or "") and str(first.run_id) in (reason or "")
    assert mark(cluster, "gpu-01")["run"] == first.run_id  # type: ignore[index]
    assert cluster.node("gpu-01").unschedulable and first.state() == "running"


def succeeded_text(db: Database, run_id: str) -> str:
    (entry,) = audit.for_run(db, run_id, actions=["run.succeeded"])  # type: ignore[arg-type]
    return str((entry.detail or {})["text"])


def test_a_node_with_a_finished_runs_stale_mark_is_given_back_and_not_reported_as_still_cordoned(db, cluster):
    """An aborted run leaves gpu-01 cordoned and marked; a person uncordons it by hand
    (kubectl), leaving the mark. The next run cordons the schedulable node itself, so it
    gives it back, and its end does not say the node stays cordoned. (Its dry run's
    forecast: test_step_context.py.)"""
    aborted = PlannedRun(db, cluster, [("gpu-01",)], steps=lambda n: node_steps(n, hold_s=3600))
    aborted.drive(lambda: aborted.cordoned() == ["gpu-01"])
    RunService(db).abort(aborted.cfg.actor("U0ADA"), aborted.run_id, now=aborted.now)
    cluster.nodes["gpu-01"] = dataclasses.replace(cluster.node("gpu-01"), unschedulable=False)
    assert mark(cluster, "gpu-01")["run"] == aborted.run_id  # type: ignore[index]

    run = PlannedRun(db, cluster, [("gpu-01",)])
    run.drive(lambda: run.state() == "succeeded")

    assert succeeded_text(db, run.run_id) == f"Run {run.run_id} finished: every step done"
    assert not cluster.node("gpu-01").unschedulable and mark(cluster, "gpu-01") is None


def test_a_node_a_person_cordons_as_its_cordon_step_starts_is_reported_as_still_cordoned_at_its_end(db, cluster):
    """gpu-02 was schedulable when its cordon step started (the step's intent), and a
    person cordoned it before that step acted: what the step found when it acted decides.
    The run leaves the node cordoned, and its end says so."""
    run = PlannedRun(db, cluster, [("gpu-01",), ("gpu-02",)])
    read, reads = cluster.get_node, []

    def a_person_cordons_it_once_read(name: str):
        found = read(name)
        if name == "gpu-02" and not reads:  # the cordon step's prepare: its intent
            reads.append(found)
            hand_cordon(cluster, name)
        return found

    cluster.get_node = a_person_cordons_it_once_read
    run.drive(lambda: run.state() == "succeeded")

    assert cluster.node("gpu-02").unschedulable and not cluster.node("gpu-01").unschedulable
    assert succeeded_text(db, run.run_id).endswith("Still cordoned, as they were before the run: gpu-02")


# ------------------------------------------------------------------ the pool checked before every wave


def hand_cordon(cluster, node: str) -> None:
    cluster.nodes[node] = dataclasses.replace(cluster.node(node), unschedulable=True)


def test_a_first_wave_that_would_take_more_nodes_than_max_unavailable_waits(db, cluster):
    hand_cordon(cluster, "gpu-05")  # a person took one node out already; the pool allows one
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=pool_config(max_unavailable=1), gated=True)

    run.passes(20)

    assert run.cordoned() == [] and not cluster.node("gpu-01").unschedulable
    assert run.state() == "running"


def test_a_node_cordoned_by_hand_during_wave_one_stops_wave_two_from_starting(db, cluster):
    run = PlannedRun(db, cluster, [("gpu-01",), ("gpu-02",)], cfg=pool_config(max_unavailable=1), gated=True)
    run.drive(lambda: run.cordoned() == ["gpu-01"])
    hand_cordon(cluster, "gpu-05")  # mid-incident, a person takes another node out

    run.passes(60)  # wave one's hold (60s) is long over

    assert ("uncordon", "gpu-01") in cluster.did()  # wave one finished
    assert run.cordoned() == ["gpu-01"] and not cluster.node("gpu-02").unschedulable
    assert run.state() == "running"


# ------------------------------------------------------------------ what people do to a run


def test_an_abort_names_every_node_it_leaves_cordoned(db, cluster):
    run = PlannedRun(db, cluster, [NODES])
    run.drive(lambda: len(run.cordoned()) == 4)

    RunService(db).abort(run.cfg.actor("U0ADA"), run.run_id, now=run.now)

    reason = stored_runs.get(db, id=run.run_id).halted_reason or ""  # type: ignore[union-attr]
    assert "Left cordoned by this run: gpu-01, gpu-02, gpu-03" in reason and "gpu-04" in reason, reason
    assert all(cluster.node(n).unschedulable for n in NODES[:4])


def test_gpu_uncordon_is_refused_for_a_node_a_run_still_holds_and_allowed_once_the_run_is_over(db, cluster):
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=lambda n: node_steps(n, hold_s=3600))
    run.drive(lambda: run.cordoned() == ["gpu-01"])
    ada = run.cfg.actor("U0ADA")

    with pytest.raises(UncordonRefused) as refused:
        Cordons(db, cluster).uncordon(ada, "gpu-01", pool="train-a", now=run.now)
    assert str(run.run_id) in str(refused.value) and "still unfinished" in str(refused.value)
    assert cluster.node("gpu-01").unschedulable and ("uncordon", "gpu-01") not in cluster.did()

    RunService(db).abort(ada, run.run_id, now=run.now)  # the run is over and leaves gpu-01 cordoned
    Cordons(db, cluster).uncordon(ada, "gpu-01", pool="train-a", now=run.now)
    assert not cluster.node("gpu-01").unschedulable



def test_a_person_giving_a_node_back_with_gpu_uncordon_leaves_an_event_on_it_naming_them_and_the_run(db, cluster):
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=lambda n: node_steps(n, hold_s=3600))
    run.drive(lambda: run.cordoned() == ["gpu-01"])
    ada = run.cfg.actor("U0ADA")
    RunService(db).abort(ada, run.run_id, now=run.now)

    Cordons(db, cluster).uncordon(ada, "gpu-01", pool="train-a", now=run.now)

    (event,) = [row for row in kube_events_due(db, now=run.now, limit=100)
                if isinstance(row.body, dict) and row.body.get("reason") == "Uncordoned"]
    assert event.body["regarding"]["name"] == "gpu-01" and event.body["type"] == "Normal"  # type: ignore[index]
    note = event.body["note"]  # type: ignore[index]
    assert "uncordoned gpu-01" in note and str(run.run_id) in note


def people_config() -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 10}},
        "access": {"users": {"U0ADA": ["operator"], "U0BOB": ["operator"], "U0EVE": ["viewer"]},
                   "names": {"U0ADA": "Ada", "U0BOB": "Bob", "U0EVE": "Eve"}},
    })


def test_drain_done_is_refused_to_someone_neither_the_requester_nor_an_operator_and_allowed_to_an_operator(
        db, cluster):
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=cfg, steps=lambda n: node_steps(n, hold_s=3600))
    run.drive(lambda: run.cordoned() == ["gpu-01"])
    request_id = RunService(db).get(run.run_id).request_id

    with pytest.raises(RunRefused):
        RunService(db).release_hold(cfg.actor("U0EVE"), request_id, now=run.now)
    run.passes(5)
    assert cluster.node("gpu-01").unschedulable  # Eve's word ended nothing

    RunService(db).release_hold(cfg.actor("U0BOB"), request_id, now=run.now)  # an operator, not the requester
    run.drive(lambda: run.state() == "succeeded")
    assert not cluster.node("gpu-01").unschedulable


def host_driver_steps(node: str) -> tuple[NodeStep, ...]:
    return (NodeStep("cordon", node, {}), NodeStep("host-driver-removed", node, {}))  # type: ignore[arg-type]


def test_confirming_the_host_driver_on_one_node_never_confirms_another_node_that_waits(db, cluster):
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",), ("gpu-02",)], cfg=cfg, steps=host_driver_steps)
    run.drive(lambda: any(s.kind == "host-driver-removed" and s.state == "running"
                          for s in RunService(db).get(run.run_id).steps))

    with pytest.raises(RunRefused):
        RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now, node="gpu-02")

    waiting = next(s for s in RunService(db).get(run.run_id).steps if s.kind == "host-driver-removed"
                   and s.node == "gpu-01")
    assert "confirmed_by" not in waiting.detail["params"]
    assert not any(e.action == "run.host-driver-removed" for e in audit.for_run(db, run.run_id))

    # The node that does wait is confirmed.
    RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now, node="gpu-01")
    waiting = next(s for s in RunService(db).get(run.run_id).steps if s.kind == "host-driver-removed"
                   and s.node == "gpu-01")
    assert waiting.detail["params"]["confirmed_by"] == "U0BOB"


# ------------------------------------------------------------------ fail closed


def wait_for_validator_steps(node: str) -> tuple[NodeStep, ...]:
    return (NodeStep("cordon", node, {}),  # type: ignore[arg-type]
            NodeStep("wait-for", node, {"conditions": ["validator-ready"], "timeout_s": 30}),  # type: ignore[arg-type]
            NodeStep("uncordon", node, {}))  # type: ignore[arg-type]


def test_a_step_still_waiting_at_its_timeout_fails_the_run_and_never_counts_as_done(db, cluster, make):
    (uid,) = [u for u, p in cluster.pods.items()
              if p.pod.node_name == "gpu-01" and p.pod.name.startswith("nvidia-operator-validator")]
    cluster.terminate(uid)
    cluster.add_pod(make.validator_pod("gpu-01", ready=False), uid="uid-validator-failing")
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=wait_for_validator_steps)

    run.drive(lambda: run.state() in ("failed", "succeeded"))

    assert run.state() == "failed"
    reason = stored_runs.get(db, id=run.run_id).halted_reason or ""  # type: ignore[union-attr]
    assert "timed out after 30s" in reason, reason
    wait = next(s for s in RunService(db).get(run.run_id).steps if s.kind == "wait-for")
    assert wait.state == "failed"
    assert cluster.node("gpu-01").unschedulable and ("uncordon", "gpu-01") not in cluster.did()


class Grants:
    """What the bot's Kubernetes identity may do, as `KubeGateway.may` answers it."""

    identity = "system:serviceaccount:gpuops:gpuops"

    def __init__(self, *granted: tuple[str, str]) -> None:
        self.granted = set(granted)

    def may(self, verb: str, resource: str) -> bool:
        return (verb, resource) in self.granted


def test_the_bot_refuses_to_start_when_a_pool_deletes_blocked_pods_and_its_identity_may_not_delete_pods():
    deleting = GpuopsConfig.model_validate({
        "pools": {"train-a": {"kind": "training", "pdb_timeout_action": "delete", "allow_delete": True},
                  "serve-b": {"kind": "training", "pdb_timeout_action": "wait"}}})
    waiting = GpuopsConfig.model_validate({"pools": {"serve-b": {"kind": "training", "pdb_timeout_action": "wait"}}})

    with pytest.raises(ConfigError) as refused:
        check_permissions(deleting, Grants())  # type: ignore[arg-type]
    assert "train-a sets pdb_timeout_action: delete" in str(refused.value)
    assert "serve-b" not in str(refused.value)
    check_permissions(deleting, Grants(("delete", "pods")))  # type: ignore[arg-type]
    check_permissions(waiting, Grants())  # type: ignore[arg-type]
