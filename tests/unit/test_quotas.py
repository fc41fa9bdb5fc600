"""The quota report over plain node, pod and ResourceQuota values: where a namespace's
pods can land (node selectors, required node affinity, tolerations against taints,
the resources a pool advertises), what its pools advertise, and each flag firing and not
firing."""

from __future__ import annotations

import dataclasses

import msgspec

from workflows.fleet.settings import InventorySettings
from workflows.kube import wire
from workflows.kube.gateway.decoding import pod_from_json
from workflows.kube.objects import (
    ANYWHERE,
    NodeRequirement,
    NodeSelectorTerm,
    Placement,
    ResourceQuotaObject,
    Taint,
    Toleration,
)
from workflows.quotas.report import evaluate

SETTINGS = InventorySettings(pool_kinds={"serving-a": "serving", "train-a": "training"})
MIG = "nvidia.com/mig-1g.10gb"


def quota(namespace: str, hard: dict[str, str], *, name: str = "gpu", used: dict[str, str] | None = None,
          scopes: tuple[str, ...] = ()) -> ResourceQuotaObject:
    return ResourceQuotaObject(namespace=namespace, name=name, hard=hard, used=used or {}, scopes=scopes)


def fleet(make, *, serving_taint: Taint | None = None, extra=()):
    """serving-a: 2 nodes x 8 GPUs (H100); train-a: 2 nodes x 8 GPUs (A100, gpu.count 8);
    mig-a: 1 node of 56 MIG slices."""
    serving = [make.node(f"serving-a-0{i}", pool="serving-a") for i in (1, 2)]
    if serving_taint is not None:
        serving = [dataclasses.replace(n, taints=(serving_taint,)) for n in serving]
    train = [make.node(f"train-a-0{i}", pool="train-a", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
             for i in (1, 2)]
    mig = [make.node("mig-a-01", pool="mig-a", capacity={"nvidia.com/gpu": None, MIG: "56"})]
    return {n.name: n for n in [*serving, *train, *mig, *extra]}


def pod(make, namespace: str, *, node: str | None = None, gpus: int = 1, resource: str = "nvidia.com/gpu",
        placement: Placement | None = None, phase: str | None = None, name: str | None = None):
    found = make.pod(node=node, namespace=namespace, name=name, gpu_requests={resource: gpus}, owner_kind="Job",
                     phase=phase or ("Running" if node else "Pending"))
    return dataclasses.replace(found, placement=placement) if placement is not None else found


def on_pool(pool: str) -> Placement:
    return Placement(node_selector={"gpuops.io/pool": pool})


def affinity(*terms: tuple[NodeRequirement, ...], fields: tuple[NodeRequirement, ...] = ()) -> Placement:
    return Placement(required_terms=tuple(NodeSelectorTerm(match_expressions=t) for t in terms)
                     + ((NodeSelectorTerm(match_fields=fields),) if fields else ()))


def reach(make, placement: Placement, **fleet_args) -> tuple[str, ...]:
    report = evaluate(nodes=fleet(make, **fleet_args), pods=[pod(make, "ml", placement=placement)], quotas=[],
                      settings=SETTINGS)
    return report.namespace("ml").pools


# --- where a pod can land ----------------------------------------------------------------

def test_a_pod_without_constraints_can_land_on_every_pool_that_advertises_what_it_asks_for(make):
    assert reach(make, Placement()) == ("serving-a", "train-a")  # mig-a advertises no whole GPU


def test_a_node_selector_picks_its_pool_and_one_letter_off_picks_none(make):
    assert reach(make, on_pool("serving-a")) == ("serving-a",)
    assert reach(make, on_pool("serving-b")) == ()


def test_required_node_affinity_operators_hold_as_kubernetes_defines_them(make):
    product = "nvidia.com/gpu.product"
    assert reach(make, affinity((NodeRequirement(product, "In", ("NVIDIA-A100-SXM4-80GB",)),))) == ("train-a",)
    assert reach(make, affinity((NodeRequirement(product, "NotIn", ("NVIDIA-A100-SXM4-80GB",)),))) == ("serving-a",)
    assert reach(make, affinity((NodeRequirement("gpuops.io/pool", "Exists"),))) == ("serving-a", "train-a")
    assert reach(make, affinity((NodeRequirement("gpuops.io/pool", "DoesNotExist"),))) == ()
    assert reach(make, affinity((NodeRequirement("nvidia.com/gpu.count", "Gt", ("7",)),))) == ("serving-a", "train-a")
    assert reach(make, affinity((NodeRequirement("nvidia.com/gpu.count", "Gt", ("8",)),))) == ()  # near miss
    assert reach(make, affinity((NodeRequirement("nvidia.com/gpu.count", "Lt", ("9",)),))) == ("serving-a", "train-a")
    assert reach(make, affinity((NodeRequirement("nvidia.com/gpu.product", "Gt", ("1",)),))) == ()  # not a number


def test_affinity_terms_are_alternatives_and_the_requirements_of_one_term_all_hold(make):
    serving = NodeRequirement("gpuops.io/pool", "In", ("serving-a",))
    a100 = NodeRequirement("nvidia.com/gpu.product", "In", ("NVIDIA-A100-SXM4-80GB",))
    assert reach(make, affinity((serving,), (a100,))) == ("serving-a", "train-a")
    assert reach(make, affinity((serving, a100))) == ()


def test_match_fields_on_the_node_name_pick_that_nodes_pool(make):
    assert reach(make, affinity(fields=(NodeRequirement("metadata.name", "In", ("train-a-02",)),))) == ("train-a",)
    assert reach(make, affinity(fields=(NodeRequirement("metadata.name", "In", ("train-a-03",)),))) == ()


def test_an_empty_affinity_term_matches_no_node(make):
    assert reach(make, Placement(required_terms=(NodeSelectorTerm(),))) == ()


def test_a_tainted_pool_takes_only_pods_that_tolerate_its_taint(make):
    taint = Taint(key="dedicated", value="serving", effect="NoSchedule")
    assert reach(make, Placement(), serving_taint=taint) == ("train-a",)
    tolerate = Placement(tolerations=(Toleration("dedicated", "Equal", "serving", "NoSchedule"),))
    assert reach(make, tolerate, serving_taint=taint) == ("serving-a", "train-a")
    other_value = Placement(tolerations=(Toleration("dedicated", "Equal", "training", "NoSchedule"),))
    assert reach(make, other_value, serving_taint=taint) == ("train-a",)
    other_effect = Placement(tolerations=(Toleration("dedicated", "Equal", "serving", "NoExecute"),))
    assert reach(make, other_effect, serving_taint=taint) == ("train-a",)
    any_value = Placement(tolerations=(Toleration("dedicated", "Exists", "", ""),))
    assert reach(make, any_value, serving_taint=taint) == ("serving-a", "train-a")
    everything = Placement(tolerations=(Toleration("", "Exists", "", ""),))
    assert reach(make, everything, serving_taint=Taint("x", "", "NoExecute")) == ("serving-a", "train-a")


def test_prefer_no_schedule_and_a_cordon_taint_do_not_close_a_pool(make):
    assert reach(make, Placement(), serving_taint=Taint("dedicated", "serving", "PreferNoSchedule")) == (
        "serving-a", "train-a")
    assert reach(make, Placement(), serving_taint=Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")) == (
        "serving-a", "train-a")


def test_a_pod_asking_for_mig_slices_lands_only_where_they_are_advertised(make):
    report = evaluate(nodes=fleet(make), pods=[pod(make, "ml", resource=MIG, gpus=2)],
                      quotas=[quota("ml", {f"requests.{MIG}": "60"})], settings=SETTINGS)
    ns = report.namespace("ml")
    assert ns.pools == ("mig-a",)
    assert ns.capacity == {MIG: 56}
    assert [f.text for f in ns.flags] == [
        f"ml: its quota of 60 {MIG} exceeds the 56 the pools it can land on advertise (mig-a)"]


def test_a_scheduled_pods_own_pool_counts_even_when_its_constraints_point_elsewhere(make):
    placed = pod(make, "ml", node="train-a-01", placement=on_pool("serving-a"))
    report = evaluate(nodes=fleet(make), pods=[placed], quotas=[], settings=SETTINGS)
    assert report.namespace("ml").pools == ("serving-a", "train-a")


def test_a_namespace_is_reached_through_the_union_of_its_pods(make):
    pods = [pod(make, "ml", placement=on_pool("serving-a")), pod(make, "ml", placement=on_pool("train-a"))]
    report = evaluate(nodes=fleet(make), pods=pods, quotas=[], settings=SETTINGS)
    ns = report.namespace("ml")
    assert ns.pools == ("serving-a", "train-a")
    assert {p.pools for p in ns.pods} == {("serving-a",), ("train-a",)}


# --- the figures -------------------------------------------------------------------------

def test_used_counts_pending_and_running_pods_not_finished_ones_and_shows_the_quotas_own_count(make):
    pods = [pod(make, "ml", node="train-a-01", gpus=2, placement=on_pool("train-a")),
            pod(make, "ml", gpus=3, placement=on_pool("train-a")),
            pod(make, "ml", node="train-a-02", gpus=4, phase="Succeeded"),
            pod(make, "ml", node="train-a-02", gpus=4, phase="Failed")]
    report = evaluate(nodes=fleet(make), pods=pods, settings=SETTINGS,
                      quotas=[quota("ml", {"requests.nvidia.com/gpu": "16"}, used={"requests.nvidia.com/gpu": "5"})])
    ns = report.namespace("ml")
    assert ns.used == {"nvidia.com/gpu": 5}
    assert ns.quota == {"nvidia.com/gpu": 16}
    assert ns.quota_status_used("nvidia.com/gpu") == 5
    assert ns.capacity == {"nvidia.com/gpu": 16}
    assert report.pool("train-a").free("nvidia.com/gpu") == 14  # 16 - 2 bound and running
    assert ns.flags == ()


def test_the_smallest_of_two_unscoped_quotas_is_the_namespaces_quota(make):
    report = evaluate(nodes=fleet(make), pods=[pod(make, "ml", placement=on_pool("train-a"))], settings=SETTINGS,
                      quotas=[quota("ml", {"requests.nvidia.com/gpu": "12"}, name="a"),
                              quota("ml", {"requests.nvidia.com/gpu": "6"}, name="b")])
    assert report.namespace("ml").quota == {"nvidia.com/gpu": 6}


def test_a_namespace_with_a_quota_and_no_pods_is_compared_with_every_pool_an_unconstrained_pod_could_use(make):
    taint = Taint(key="dedicated", value="serving", effect="NoSchedule")
    report = evaluate(nodes=fleet(make, serving_taint=taint), pods=[], settings=SETTINGS,
                      quotas=[quota("research", {"requests.nvidia.com/gpu": "24"})])
    ns = report.namespace("research")
    assert ns.assumed_reach and ns.pools == ("mig-a", "train-a")
    assert ns.capacity == {"nvidia.com/gpu": 16}
    (flag,) = ns.flags
    assert flag.kind == "exceeds"
    assert flag.text == ("research: its quota of 24 GPUs exceeds the 16 the pools it can land on advertise "
                         "(mig-a and train-a); it has no GPU pods, so this counts every pool a pod without "
                         "constraints could land on")


# --- the flags ---------------------------------------------------------------------------

def test_a_quota_within_what_its_pools_advertise_is_not_flagged_and_one_more_gpu_is(make):
    pods = [pod(make, "ml", placement=on_pool("train-a"))]
    fits = evaluate(nodes=fleet(make), pods=pods, quotas=[quota("ml", {"requests.nvidia.com/gpu": "16"})],
                    settings=SETTINGS)
    assert fits.flags == ()
    over = evaluate(nodes=fleet(make), pods=pods, quotas=[quota("ml", {"requests.nvidia.com/gpu": "17"})],
                    settings=SETTINGS)
    assert [f.text for f in over.flags] == [
        "ml: its quota of 17 GPUs exceeds the 16 the pools it can land on advertise (train-a)"]


def test_quotas_that_together_promise_a_pool_more_than_it_has_are_overcommitted(make):
    pods = [pod(make, "team-a", placement=on_pool("train-a")), pod(make, "team-b", placement=on_pool("train-a"))]
    quotas = [quota("team-a", {"requests.nvidia.com/gpu": "10"}), quota("team-b", {"requests.nvidia.com/gpu": "8"})]
    report = evaluate(nodes=fleet(make), pods=pods, quotas=quotas, settings=SETTINGS)
    (flag,) = report.flags
    assert flag.kind == "overcommit" and flag.pools == ("train-a",) and flag.namespaces == ("team-a", "team-b")
    assert flag.text == ("Overcommitted: the quotas on nvidia.com/gpu of team-a (10) and team-b (8) add to 18, "
                         "more than the 16 that the pools they can land on advertise (train-a)")
    assert report.flags_about_pool("train-a") == (flag,) and report.flags_about_pool("serving-a") == ()


def test_quotas_that_fit_together_or_draw_on_more_pools_are_not_overcommitted(make):
    pods = [pod(make, "team-a", placement=on_pool("train-a")), pod(make, "team-b", placement=on_pool("train-a"))]
    fits = [quota("team-a", {"requests.nvidia.com/gpu": "8"}), quota("team-b", {"requests.nvidia.com/gpu": "8"})]
    assert evaluate(nodes=fleet(make), pods=pods, quotas=fits, settings=SETTINGS).flags == ()
    wider = [pod(make, "team-a", placement=on_pool("train-a")), pod(make, "team-b")]  # team-b: serving-a too
    quotas = [quota("team-a", {"requests.nvidia.com/gpu": "10"}), quota("team-b", {"requests.nvidia.com/gpu": "8"})]
    report = evaluate(nodes=fleet(make), pods=wider, quotas=quotas, settings=SETTINGS)
    assert [f.kind for f in report.flags] == []  # 18 against the 32 of train-a and serving-a


def test_a_namespace_without_a_quota_that_can_land_on_a_serving_pool_is_flagged_with_its_free_gpus(make):
    pods = [pod(make, "adhoc", node="serving-a-01", gpus=6), pod(make, "serving", node="serving-a-02", gpus=4,
                                                                  placement=on_pool("serving-a"))]
    report = evaluate(nodes=fleet(make), pods=pods, settings=SETTINGS,
                      quotas=[quota("serving", {"requests.nvidia.com/gpu": "8"})])
    assert [(f.kind, f.namespaces, f.pools) for f in report.flags] == [
        ("unquoted-serving", ("adhoc",), ("serving-a",))]
    assert report.flags[0].text == ("adhoc has no GPU quota and can land on serving pool serving-a: nothing keeps "
                                    "it from taking the pool's last 6 free GPUs")


def test_a_namespace_without_a_quota_on_training_pools_only_is_not_flagged(make):
    report = evaluate(nodes=fleet(make), pods=[pod(make, "adhoc", placement=on_pool("train-a"))], quotas=[],
                      settings=SETTINGS)
    assert report.flags == ()


def test_a_quota_on_another_resource_leaves_the_one_its_pods_use_unquoted(make):
    report = evaluate(nodes=fleet(make), pods=[pod(make, "ml", placement=on_pool("serving-a"), gpus=2)],
                      quotas=[quota("ml", {f"requests.{MIG}": "4"})], settings=SETTINGS)
    kinds = {f.kind: f.text for f in report.flags}
    assert kinds["unquoted-serving"] == ("ml has no quota on nvidia.com/gpu and can land on serving pool serving-a: "
                                         "nothing keeps it from taking the pool's last 16 free GPUs")
    assert kinds["exceeds"].startswith(f"ml: its quota of 4 {MIG} exceeds the 0 ")


def test_a_quota_entry_without_the_requests_prefix_is_flagged_as_not_enforced_and_caps_nothing(make):
    report = evaluate(nodes=fleet(make), pods=[pod(make, "ml", node="serving-a-01", placement=on_pool("serving-a"))],
                      quotas=[quota("ml", {"nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "4"})], settings=SETTINGS)
    ns = report.namespace("ml")
    assert ns.quota == {}
    assert sorted(f.kind for f in ns.flags) == ["not-enforced", "not-enforced", "unquoted-serving"]
    assert ("ml: `nvidia.com/gpu` in quota gpu is not enforced: Kubernetes counts an extended resource only as "
            "`requests.nvidia.com/gpu`") in [f.text for f in ns.flags]


# --- reading the API's JSON --------------------------------------------------------------

def _pod_json(name: str, *, gpus: int | None) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {
        "nodeSelector": {"gpuops.io/pool": "serving-a"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "serving", "effect": "NoSchedule"},
                        {"operator": "Exists"}],
        "containers": [{"name": "main", "resources": resources}]}}


def test_a_gpu_pods_scheduling_fields_are_read_and_pods_of_one_spec_share_one_value():
    first, second = pod_from_json(_pod_json("a", gpus=2)), pod_from_json(_pod_json("b", gpus=2))
    assert first.placement == Placement(
        node_selector={"gpuops.io/pool": "serving-a"},
        required_terms=(NodeSelectorTerm(match_expressions=(
            NodeRequirement("nvidia.com/gpu.product", "In", ("H100",)),)),),
        tolerations=(Toleration("dedicated", "Equal", "serving", "NoSchedule"), Toleration("", "Exists", "", "")))
    assert first.placement is second.placement
    # A pod that asks for no GPU keeps none of it (the cache holds thousands of operand pods).
    assert pod_from_json(_pod_json("c", gpus=None)).placement is ANYWHERE


def test_a_resource_quota_keeps_its_gpu_entries_and_scopes_only():
    found = wire.resource_quota_view(msgspec.json.decode(msgspec.json.encode({
        "metadata": {"name": "gpu", "namespace": "ml"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "8", "requests.cpu": "64", "nvidia.com/mig-1g.10gb": "4",
                          "limits.nvidia.com/gpu.shared": "2"}, "scopes": ["NotTerminating"],
                 "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                                         "values": ["high"]}]}},
        "status": {"used": {"requests.nvidia.com/gpu": "3", "requests.cpu": "10"}}}), type=wire.ResourceQuotaWire))
    assert dict(found.hard) == {"requests.nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "4",
                                "limits.nvidia.com/gpu.shared": "2"}
    assert dict(found.used) == {"requests.nvidia.com/gpu": "3"}
    assert found.scopes == ("NotTerminating", "PriorityClass")
