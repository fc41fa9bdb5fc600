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
    def __init__(self, params, *, window_end=None):
        self.params, self.window_end, self.now = params, window_end, NOW
        self.node, self.run_id, self.request_id, self.dry_run = "h1", "run-7", "req-7", False


def test_the_host_driver_step_waits_for_a_person_tells_the_thread_once_and_ends_by_the_window():
    from workflows.engine.steps import Done, HostDriverByHand, Waiting

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
