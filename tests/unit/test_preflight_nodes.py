"""Pre-flight of every kind: a node with an open finding the change does not fix is left
out of the waves unless the request names it (`--include`), budgets that allow no
disruption are named with their pods, and a dry run has the request's hash."""

from __future__ import annotations

import datetime as dt

import pytest

from commands.drain_grammar import take_include_option
from workflows.drain.plan import DrainRefused, DrainRequestError, DrainAsk, drain_spec, plan_drain
from workflows.kube.objects import DisruptionBudget
from workflows.pools.config import PoolConfig
from workflows.upgrade.plan import UpgradeAsk, plan_upgrade
from workflows.upgrade.scope import UpgradeRefused

NEW = "580.105.08"
NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
POLICY = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 1,
                                    "upgrade_soak": "5m"})


def _fleet(make, *, short=("s3",), not_ready=(), extra_pods=()):
    # s3 advertises 7 of its 8 GPUs (GFD counts 8): an open critical finding.
    nodes = [make.node(n, pool="serving-a", capacity={"nvidia.com/gpu": "7"} if n in short else None,
                       ready=False if n in not_ready else True)
             for n in ("s1", "s2", "s3", "s4")]
    pods = [p for n in nodes for p in (make.driver_pod(n.name), make.device_plugin_pod(n.name),
                                       make.validator_pod(n.name))]
    policy = make.cluster_policy(driver={"enabled": True, "version": "580.95.05",
                                         "upgradePolicy": {"autoUpgrade": False}})
    return make.fleet(nodes, [*pods, *extra_pods], policies=[policy])


def _upgrade(fleet, *, include=(), now=NOW, **kw):
    return plan_upgrade(UpgradeAsk(pool="serving-a", version=NEW, include=include), fleet=fleet, policy=POLICY,
                        now=now, requested_by="U0ALICE", cluster_policy_scope="all-pools", **kw)


def test_an_upgrade_leaves_out_a_node_missing_a_gpu_and_says_what_including_it_would_do(make):
    planned = _upgrade(_fleet(make))

    assert "s3" not in planned.plan.nodes and set(planned.plan.nodes) == {"s1", "s2", "s4"}
    (note,) = [n for n in planned.plan.summary.preflight if n.check == "nodes"]
    assert (note.code, note.severity, note.nodes) == ("left-out", "critical", ("s3",))
    assert "s3 is left out of the driver upgrade: it has an open finding (advertised-mismatch)" in note.sentence
    assert "`--include s3`" in note.sentence and "validation waits for every GPU" in note.sentence


def test_an_upgrade_that_includes_the_node_plans_it_and_says_the_run_may_halt_there(make):
    planned = _upgrade(_fleet(make), include=("s3",))

    assert "s3" in planned.plan.nodes
    (note,) = [n for n in planned.plan.summary.preflight if n.check == "nodes"]
    assert note.code == "included"
    assert "the run halts there with s3 cordoned" in note.sentence


def test_including_a_node_the_change_does_not_reach_is_refused(make):
    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(_fleet(make), include=("t9",))
    assert refused.value.code == "include-not-planned"


def test_a_drain_of_a_pool_leaves_out_a_node_not_ready_but_drains_one_named_by_name(make):
    fleet = _fleet(make, short=(), not_ready=("s2",))
    policy = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 2})
    pools = {"serving-a": policy}

    whole = plan_drain(drain_spec(DrainAsk(targets=("serving-a",)), fleet=fleet, pools=pools, now=NOW),
                       fleet=fleet, pods_by_node={}, policy=policy, open_requests=(), now=NOW,
                       requested_by="U0ALICE")
    assert "s2" not in whole.plan.nodes
    assert [n.code for n in whole.plan.summary.preflight] == ["left-out", "held-until-done", "gpu-signals-off"]
    assert "validation waits for it to be Ready" in whole.plan.summary.preflight[0].sentence

    named = plan_drain(drain_spec(DrainAsk(targets=("s2",)), fleet=fleet, pools=pools, now=NOW),
                       fleet=fleet, pods_by_node={}, policy=policy, open_requests=(), now=NOW,
                       requested_by="U0ALICE")
    assert named.plan.nodes == ("s2",)
    assert [n.code for n in named.plan.summary.preflight] == ["included", "held-until-done", "gpu-signals-off"]


def test_an_upgrade_names_a_budget_that_allows_no_disruption_with_its_pods_and_what_the_run_does(make):
    api = make.pod(node="s2", namespace="serve", name="api-0", labels={"app": "api"}, owner_kind="StatefulSet",
                   gpu_requests={"nvidia.com/gpu": 1}, image="registry.example/api:1")
    fleet = _fleet(make, short=(), extra_pods=(api,))
    budget = DisruptionBudget(namespace="serve", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0)

    planned = _upgrade(fleet, gpu_pods=[api], budgets=[budget])

    (note,) = [n for n in planned.plan.summary.preflight if n.check == "budgets"]
    assert (note.code, note.nodes, note.details) == ("budget-blocks", ("s2",), ("serve/api-0",))
    assert note.sentence.startswith("PodDisruptionBudget serve/api-pdb allows 0 disruptions now")
    assert "then gpuops halts the run with the node cordoned, for a person to decide" in note.sentence


def test_a_dry_run_a_few_minutes_before_the_request_has_the_requests_plan_hash(make):
    fleet = _fleet(make, short=())
    dry = _upgrade(fleet, now=NOW)
    asked = _upgrade(fleet, now=NOW + dt.timedelta(minutes=4))
    assert dry.plan == asked.plan
    assert dry.window_start != asked.window_start  # the request still says when it was asked to start


def test_include_reads_one_node_several_and_the_equals_form_anywhere_in_the_words():
    assert take_include_option(["serving-a", "to", "580", "--include", "s3,s4", "--include=s5", "why"]) == (
        ["serving-a", "to", "580", "why"], ("s3", "s4", "s5"))
    with pytest.raises(DrainRequestError):
        take_include_option(["serving-a", "--include"])


def test_a_drain_whose_every_node_has_findings_is_refused_saying_how_to_include_them(make):
    fleet = _fleet(make, short=("s1", "s2", "s3", "s4"))
    policy = PoolConfig.model_validate({"kind": "training", "windows": "always", "max_unavailable": 2})
    spec = drain_spec(DrainAsk(targets=("serving-a",)), fleet=fleet, pools={"serving-a": policy}, now=NOW)
    with pytest.raises(DrainRefused) as refused:
        plan_drain(spec, fleet=fleet, pods_by_node={}, policy=policy, open_requests=(), now=NOW,
                   requested_by="U0ALICE")
    assert refused.value.code == "every-node-has-findings"
    assert "--include <node>" in refused.value.reason
