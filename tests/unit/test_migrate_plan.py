"""Moving nodes from host drivers to the GPU Operator, planned: who moves (host drivers,
and nodes where both race), who is left out or refused, one node at a time, the steps
each goes through, and a rollback that restores each node's snapshot in one step."""

from __future__ import annotations

import datetime as dt

import pytest

from workflows.migrate.plan import MigrateAsk, MigrateRefused, MigrateRollbackOf, plan_migrate
from workflows.pools.config import PoolConfig

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
POLICY = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 3})
HOST = {"nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/cuda.driver-version.full": "570.172.08"}


def _fleet(make, *, operator=(), none=()):
    nodes, pods = [], []
    for name in ("h1", "h2", "h3"):
        if name in operator:
            nodes.append(make.node(name, pool="hosts"))
            pods += make.operands(name)
        elif name in none:
            nodes.append(make.node(name, pool="hosts", labels={"nvidia.com/cuda.driver-version.full": None}))
            pods.append(make.device_plugin_pod(name))
        else:
            nodes.append(make.node(name, pool="hosts", labels=HOST))
            pods.append(make.device_plugin_pod(name))
    return make.fleet(nodes, pods)


def _plan(fleet, targets=("hosts",), to="operator", **kw):
    return plan_migrate(MigrateAsk(targets=tuple(targets), to=to), fleet=fleet, policy_of={"hosts": POLICY}, now=NOW,
                        requested_by="U0ALICE", **kw)


def test_host_driver_nodes_move_one_at_a_time_through_a_person_and_a_test_pod(make):
    planned = _plan(_fleet(make, operator=("h3",)))

    assert [w.nodes for w in planned.plan.waves] == [("h1",), ("h2",)]  # one at a time, whatever the budget
    kinds = [s.kind for s in planned.plan.waves[0].steps]
    assert kinds == ["snapshot", "cordon", "evict", "host-driver-removed", "node-labels", "wait-for", "gpu-check",
                     "validate", "uncordon"]
    labels = next(s for s in planned.plan.waves[0].steps if s.kind == "node-labels")
    assert dict(labels.params["labels"]) == {"nvidia.com/gpu.deploy.driver": "true"}
    check = next(s for s in planned.plan.waves[0].steps if s.kind == "gpu-check")
    assert (check.params["command"], check.params["resource"]) == (("nvidia-smi",), "nvidia.com/gpu")
    notes = planned.plan.summary.notes
    assert any(n.startswith("h1: driver owner host (label nvidia.com/gpu.deploy.driver=pre-installed")
               and n.endswith("nvidia.com/gpu.deploy.driver: pre-installed -> true") for n in notes), notes
    assert any("remove the host's NVIDIA driver packages" in n for n in notes)
    assert "h3 already runs the operator's driver: left out" in notes


def test_a_node_without_a_driver_is_refused_with_its_evidence_and_a_pool_already_moved_has_nothing_to_do(make):
    with pytest.raises(MigrateRefused) as refused:
        _plan(_fleet(make, none=("h2",)))
    assert refused.value.code == "not-movable"
    assert refused.value.reason.startswith("h2's driver cannot be moved to the operator's driver (driver owner: none")
    with pytest.raises(MigrateRefused) as nothing:
        _plan(_fleet(make, operator=("h1", "h2", "h3")))
    assert nothing.value.code == "nothing-to-move"


def test_a_rollback_restores_each_node_from_its_snapshot_and_leaves_it_cordoned(make):
    snapshot = {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/gpu.deploy.dcgm": "true",
                           "team": "ml"},
                "taints": [{"key": "gpu", "value": "", "effect": "NoSchedule"}]}
    planned = _plan(_fleet(make, operator=("h1",)), rollback=MigrateRollbackOf(
        run="run-7", snapshots=(("h1", snapshot),), keys=("nvidia.com/gpu.deploy.driver",)))
    (wave,) = planned.plan.waves
    assert [s.kind for s in wave.steps] == ["cordon", "restore"]  # no uncordon: a person reinstalls first
    restore = wave.steps[1]
    assert list(restore.params["keys"]) == ["nvidia.com/gpu.deploy.dcgm", "nvidia.com/gpu.deploy.driver"]
    assert wave.steps[0].params["takes_over"] == "run-7"


class _Ctx:
    def __init__(self, params, *, window_end=None, inventory=None, intent=None):
        self.params, self.window_end, self.now = params, window_end, NOW
        self.zone = dt.timezone.utc
        self.node, self.run_id, self.request_id, self.dry_run = "h1", "run-7", "req-7", False
        self.kind = "host-driver-removed"
        self.inventory, self.intent, self.records = inventory, dict(intent or {}), {}

    def node_inventory(self):
        return self.inventory

    def record(self, *, key, action, target, detail):
        self.records.setdefault(key, (action, target, detail))


def test_the_host_driver_step_waits_for_a_person_tells_the_thread_once_and_ends_by_the_window():
    from workflows.engine.steps.contract import Done, Waiting
    from workflows.engine.steps.host_driver import HostDriverByHand

    step = HostDriverByHand(install=False)
    waiting = step.advance(_Ctx({}))  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting) and waiting.notice is not None
    assert waiting.notice.key == "host-driver/h1" and "`/gpu migrate confirm run-7`" in waiting.notice.text
    done = step.advance(_Ctx({"confirmed_by": "U0ALICE", "confirmed_by_name": "alice"}))  # type: ignore[arg-type]
    assert done == Done("alice confirmed the host driver is gone from h1", {"confirmed_by": "U0ALICE"})
    assert step.timeout(_Ctx({"timeout_s": 7200})) == dt.timedelta(hours=2)  # type: ignore[arg-type]
    ends = _Ctx({"timeout_s": 7200}, window_end=NOW + dt.timedelta(minutes=30))
    assert step.timeout(ends) == dt.timedelta(minutes=30)  # type: ignore[arg-type]


def test_the_way_back_turns_the_operators_driver_off_first_then_waits_for_a_person_to_install_the_hosts(make):
    planned = _plan(_fleet(make, operator=("h1", "h2")), to="host")

    assert [w.nodes for w in planned.plan.waves] == [("h1",), ("h2",)]  # h3 already runs a host driver
    steps = planned.plan.waves[0].steps
    assert [s.kind for s in steps] == ["snapshot", "cordon", "evict", "node-labels", "wait-for",
                                       "host-driver-installed", "wait-for", "gpu-check", "validate", "uncordon"]
    assert dict(steps[3].params["labels"]) == {"nvidia.com/gpu.deploy.driver": "pre-installed"}
    assert list(steps[4].params["conditions"]) == ["no-operator-driver"]
    notes = planned.plan.summary.notes
    assert any(n.startswith("h1: driver owner operator") and n.endswith("true -> pre-installed") for n in notes)
    assert "h3 already runs a host driver: left out" in notes


def test_labels_people_set_are_named_in_the_plan_removed_with_the_deploy_label_and_only_on_the_way_in(make):
    hand = {"h1": {"nvidia.com/gpu.product": ("A100-by-hand", "kubectl-label")}, "h2": {}}
    planned = _plan(_fleet(make, operator=("h3",)), hand_set=hand)

    steps = {s.node: s for w in planned.plan.waves for s in w.steps if s.kind == "node-labels"}
    assert dict(steps["h1"].params["labels"]) == {"nvidia.com/gpu.deploy.driver": "true",
                                                 "nvidia.com/gpu.product": None}
    assert dict(steps["h2"].params["labels"]) == {"nvidia.com/gpu.deploy.driver": "true"}
    (note,) = [n for n in planned.plan.summary.notes if n.startswith("h1: ")]
    assert note.endswith("hand-set labels removed for GFD to publish its own (a rollback puts them back): "
                         "nvidia.com/gpu.product=A100-by-hand (set by kubectl-label)"), note
    # The way back to the host never touches them.
    back = _plan(_fleet(make, operator=("h1", "h2", "h3")), to="host", hand_set=hand)
    assert all(dict(s.params["labels"]) == {"nvidia.com/gpu.deploy.driver": "pre-installed"}
               for w in back.plan.waves for s in w.steps if s.kind == "node-labels")


@pytest.mark.parametrize(("at_once", "max_unavailable", "waves"), [
    (1, 3, [("h1",), ("h2",), ("h3",)]),
    (2, 3, [("h1",), ("h2", "h3")]),
    (3, 1, [("h1",), ("h2",), ("h3",)]),  # never above max_unavailable
])
def test_a_pool_may_move_several_nodes_at_once_after_the_first_but_never_above_max_unavailable(
        make, at_once, max_unavailable, waves):
    policy = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": max_unavailable,
                                        "migrate_at_once": at_once})
    planned = plan_migrate(MigrateAsk(targets=("hosts",)), fleet=_fleet(make), policy_of={"hosts": policy}, now=NOW,
                           requested_by="U0ALICE")

    assert [w.nodes for w in planned.plan.waves] == waves
    pace = "one node at a time" if len(waves) == 3 else "the first node alone, then up to 2 at once"
    assert any(n.startswith(pace + ": snapshot") for n in planned.plan.summary.notes)


def test_the_pools_evidence_setting_reaches_the_step_and_the_plan_says_so(make):
    policy = PoolConfig.model_validate({"kind": "training", "windows": "always", "host_driver_evidence": True})
    planned = plan_migrate(MigrateAsk(targets=("h1",)), fleet=_fleet(make), policy_of={"hosts": policy}, now=NOW,
                           requested_by="U0ALICE")

    (step,) = [s for w in planned.plan.waves for s in w.steps if s.kind == "host-driver-removed"]
    assert step.params["evidence"] is True
    assert any("This pool takes the node's evidence too (host_driver_evidence)" in n for n in planned.plan.summary.notes)
    assert _plan(_fleet(make)).plan.waves[0].steps[3].params["evidence"] is False


def test_hand_set_labels_are_discovery_labels_a_persons_tool_owns():
    from workflows.kube.labels import hand_set_labels
    found = hand_set_labels({
        "nvidia.com/gpu.product": ("A100", ("kubectl-label",)),
        "nvidia.com/gpu.count": ("8", ("kubectl-edit", "nfd-master")),
        "nvidia.com/gpu.memory": ("81920", ("nfd-master",)),  # discovered
        "nvidia.com/gpu.deploy.driver": ("pre-installed", ("kubectl-label",)),  # a knob people set on purpose
        "nvidia.com/mig.config": ("all-1g.10gb", ("kubectl",)),  # a knob
        "nvidia.com/gpu.present": ("true", ("kubectl-label",)),  # the operator's mark of a GPU node
        "gpuops.io/pool": ("train", ("kubectl-label",)),  # not a discovery label
        "feature.node.kubernetes.io/pci-10de.present": ("true", ("k9s",)),
    })
    assert found == {"nvidia.com/gpu.product": ("A100", "kubectl-label"),
                     "nvidia.com/gpu.count": ("8", "kubectl-edit"),
                     "feature.node.kubernetes.io/pci-10de.present": ("true", "k9s")}


def _host_node(make, *, driver_works: bool):
    """h1 with no operator driver pod: a working driver (validator Ready, every GPU
    advertised) or none (the validator waits for one, nothing advertised)."""
    gpus = "8" if driver_works else "0"
    node = make.node("h1", pool="hosts", labels=HOST, capacity={"nvidia.com/gpu": gpus})
    validator = (make.validator_pod("h1") if driver_works else
                 make.validator_pod("h1", phase="Pending", ready=False, waiting_reason="PodInitializing"))
    return make.fleet([node], [make.device_plugin_pod("h1"), validator]).nodes["h1"]


@pytest.mark.parametrize("install", [False, True])
def test_the_nodes_evidence_completes_the_host_driver_step_only_when_the_pool_takes_it(make, install):
    from workflows.engine.steps.contract import Done, Waiting
    from workflows.engine.steps.host_driver import HostDriverByHand

    step = HostDriverByHand(install=install)
    before = _host_node(make, driver_works=not install)
    after = _host_node(make, driver_works=install)
    intent = step.prepare(_Ctx({}, inventory=before))  # type: ignore[arg-type]
    assert intent == {"driver_worked": not install}

    unchanged = step.advance(_Ctx({"evidence": True}, inventory=before, intent=intent))  # type: ignore[arg-type]
    assert isinstance(unchanged, Waiting)
    shown = step.advance(_Ctx({"evidence": False}, inventory=after, intent=intent))  # type: ignore[arg-type]
    assert isinstance(shown, Waiting) and "confirm once its packages" in shown.reason
    ctx = _Ctx({"evidence": True}, inventory=after, intent=intent)
    done = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(done, Done)
    assert done.note.startswith(f"the host driver is {'installed' if install else 'gone'}, by the node's evidence: h1 ")
    ((action, target, detail),) = ctx.records.values()
    assert (action, target, detail["by"]) == (
        f"run.host-driver-{'installed' if install else 'removed'}", "node h1", "evidence")


def test_a_node_whose_driver_was_already_off_when_the_step_began_waits_for_a_person(make):
    """No working driver at the start (a host driver that had failed): that its driver does
    not work proves nothing about its packages."""
    from workflows.engine.steps.contract import Waiting
    from workflows.engine.steps.host_driver import HostDriverByHand

    step = HostDriverByHand(install=False)
    off = _host_node(make, driver_works=False)
    intent = step.prepare(_Ctx({}, inventory=off))  # type: ignore[arg-type]
    waiting = step.advance(_Ctx({"evidence": True}, inventory=off, intent=intent))  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting)
    assert waiting.reason == ("h1 had no working host driver when this step began, so its evidence cannot tell the "
                            "change: waiting for a person to confirm")


def test_a_move_says_which_way_it_goes_and_a_label_already_set_is_not_shown_as_a_change(make):
    from commands import messages as msg
    from workflows.migrate import messages as say
    from workflows.migrate.plan import direction_of

    there = _plan(_fleet(make, operator=("h3",)))
    back = _plan(_fleet(make, operator=("h1", "h2")), targets=("h1", "h2"), to="host")
    rollback = _plan(_fleet(make, operator=("h1",)), rollback=MigrateRollbackOf(
        run="run-7", snapshots=(("h1", {"labels": {}, "taints": []}),), keys=()))

    assert [msg.migrate_title("req-1", "hosts", direction_of(p.plan)) for p in (there, back, rollback)] == [
        "Move to the operator req-1 · hosts", "Move back to host drivers req-1 · hosts",
        "Rollback of a driver move req-1 · hosts"]
    note = say.node_note("h1", "conflict", (), "nvidia.com/gpu.deploy.driver", "true", "true")
    assert note.endswith("nvidia.com/gpu.deploy.driver: already true") and "true -> true" not in note


def test_help_for_migrate_offers_both_ways():
    from commands.catalog import dispatch
    from commands.services import Services
    from workflows.config import GpuopsConfig

    config = GpuopsConfig.model_validate({"access": {"users": {"U0ERIN": ["admin"]}}})
    reply = dispatch("help migrate", actor=config.actor("U0ERIN"), services=Services(config=config, fleet=None),  # type: ignore[arg-type]
                     now=NOW)

    assert "to operator|host" in reply.title
    assert any("to host" in b for s in reply.sections for b in s.bullets)
