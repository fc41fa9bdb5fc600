"""A pool's documented placement (`workloads: {mig, full_gpu}`): which workloads may land
on MIG slices and which on whole GPUs; a running pod that breaks it is a finding, and
`/gpu status <pool>` shows the rule."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workflows.config import GpuopsConfig

CONFIG = GpuopsConfig.model_validate({"pools": {"inf": {"kind": "serving", "workloads": {
    "mig": {"namespaces": ["inference"]},
    "full_gpu": {"namespaces": ["training", "research"], "selector": "team=ml"}}}}})


def _fleet(make, pods):
    mixed = make.node("inf-01", pool="inf", labels={"nvidia.com/mig.strategy": "mixed",
                                                   "nvidia.com/mig.config": "all-1g.10gb",
                                                   "nvidia.com/mig-1g.10gb.count": "56"},
                      capacity={"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": "56"})
    whole = make.node("inf-02", pool="inf")
    return make.fleet([mixed, whole], [*make.operands("inf-01"), *make.operands("inf-02"), *pods],
                      settings=CONFIG.inventory_settings())


def test_pods_outside_the_pools_placement_are_a_finding_that_names_them_and_the_rule(make):
    pods = [
        make.pod(node="inf-01", namespace="inference", name="ok-slice", owner_kind="ReplicaSet",
                 gpu_requests={"nvidia.com/mig-1g.10gb": 1}),
        make.pod(node="inf-01", namespace="training", name="trainer-0", owner_kind="Job",
                 gpu_requests={"nvidia.com/mig-1g.10gb": 1}),
        make.pod(node="inf-02", namespace="training", name="big-0", owner_kind="Job", labels={"team": "ml"},
                 gpu_requests={"nvidia.com/gpu": 8}),
        make.pod(node="inf-02", namespace="inference", name="llm-0", owner_kind="ReplicaSet",
                 gpu_requests={"nvidia.com/gpu": 1}),
        make.pod(node="inf-02", namespace="inference", name="done", owner_kind="Job", phase="Succeeded",
                 gpu_requests={"nvidia.com/gpu": 1}),
    ]
    fleet = _fleet(make, pods)

    found = sorted((f.subject, f.message) for f in fleet.findings if f.code == "workload-misplaced")
    assert found == [
        ("inf-01", "training/trainer-0 uses MIG slices on inf-01, but pool inf keeps MIG slices for namespace "
                   "inference (workloads.mig): move it, or document it in the pool's configuration"),
        ("inf-02", "inference/llm-0 uses whole GPUs on inf-02, but pool inf keeps whole GPUs for namespaces "
                   "training, research and pods matching team=ml (workloads.full_gpu): move it, or document it "
                   "in the pool's configuration"),
    ]


def test_a_pool_without_documented_placement_has_no_such_finding(make):
    pods = [make.pod(node="inf-01", namespace="anything", owner_kind="Job", gpu_requests={"nvidia.com/mig-1g.10gb": 1})]
    mixed = make.node("inf-01", pool="other", labels={"nvidia.com/mig.strategy": "mixed"})
    fleet = make.fleet([mixed], [*make.operands("inf-01"), *pods], settings=CONFIG.inventory_settings())
    assert not [f for f in fleet.findings if f.code == "workload-misplaced"]


def test_a_placement_rule_that_cannot_match_is_refused_at_start():
    with pytest.raises(ValidationError, match="workloads namespaces must be namespace names"):
        GpuopsConfig.model_validate({"pools": {"inf": {"workloads": {"mig": {"namespaces": ["Inference"]}}}}})
