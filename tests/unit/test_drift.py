"""Drift and the pool's word, as a user meets them: `/gpu note` (stored, audited, shown in
`/gpu node`, refusing bad input with its own sentence and storing nothing), a person's
cordon or taint reported as forgotten only once older than `inventory.forgotten_after`
(counted from gpuops' first sight of it, under freezegun) and silenced by a note,
`/gpu compare <pool>` grouping the nodes that differ from the majority, and the pool's
policy in `/gpu status <pool>` as the plans apply it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path

from freezegun import freeze_time

from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from fleet_builder import NOW
from static_fleet import StaticFleet  # a source that keeps no node objects
from storage import audit
from storage import notes as stored_notes
from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.fleet.compare import drift_of
from workflows.fleet.first_seen import CORDON, FirstSeen
from workflows.fleet.node_detail import HandSet
from workflows.fleet.restrictions import hand_set_marks
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, NodeObject, Placement, PodObject, Taint, Toleration

CONFIG_VALUES = {
    "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": "50%",
                          "min_ready_gpus": 8, "canary": "gpu-a-01", "upgrade_soak": "15m",
                          "approvers": ["U0ANN"]}},
    "upgrades": {"gpu_check": {"image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}},
    "access": {"users": {"U0VIC": ["viewer"], "U0OPS": ["operator"]}, "names": {"U0ANN": "ann"}}}
CONFIG = GpuopsConfig.model_validate(CONFIG_VALUES)
PERSON_TAINT = Taint(key="team", value="alice", effect="NoSchedule")


class CachedFleet:
    """A fleet source that keeps node objects, as the watch cache does (`node(name)`)."""

    def __init__(self, fleet: Fleet, objects: Sequence[NodeObject], pods: Sequence[PodObject] = ()) -> None:
        self.value = fleet
        self.objects = {o.name: o for o in objects}
        self.pods = list(pods)

    def fleet(self, now: dt.datetime) -> Fleet:
        return self.value

    def node(self, name: str) -> NodeObject | None:
        return self.objects.get(NodeName(name))

    def pods_on(self, node: str) -> list[PodObject]:
        return [p for p in self.pods if p.node_name == node]


def services_for(make, tmp_path: Path, nodes: Sequence[NodeObject], *, config: GpuopsConfig = CONFIG,
                 pods_of: Mapping[str, list] | None = None, extra_pods: Sequence[PodObject] = ()) -> Services:
    pods = [p for n in nodes for p in (pods_of or {}).get(n.name, make.operands(n.name))]
    pods += extra_pods
    fleet = make.fleet(nodes, pods, settings=config.inventory_settings())
    return Services.on_database(config=config, fleet=CachedFleet(fleet, nodes, pods),
                                database=open_database(tmp_path / "gpuops.db"))


def text_of(reply: Reply) -> str:
    parts = [reply.title, reply.summary or ""]
    for s in reply.sections:
        parts += [s.title or "", s.text or "", *s.bullets, *(f"{f.label}: {f.value}" for f in s.facts),
                  *(n.text for n in s.notices)]
        if s.table is not None:
            parts += [" | ".join(row) for row in s.table.rows]
    return "\n".join(parts)


def codes(reply: Reply) -> list[str]:
    return [n.text for s in reply.sections for n in s.notices]


def three_nodes(make) -> list[NodeObject]:
    return [make.node("gpu-a-01"), make.node("gpu-a-02", unschedulable=True), make.node("gpu-a-03")]


# --------------------------------------------------------------------------------------
# /gpu note


def test_an_operators_note_is_stored_audited_and_shown_on_the_node(make, tmp_path):
    services = services_for(make, tmp_path, three_nodes(make))
    reply = dispatch("note gpu-a-02 waiting for a new PSU (ticket HW-123) for 3d", actor=CONFIG.actor("U0OPS"),
                     services=services, now=NOW)

    assert reply.ok, text_of(reply)
    assert 'Note on gpu-a-02 until 2025-06-10 12:00 UTC: "waiting for a new PSU (ticket HW-123)"' in reply.summary
    assert "not reported as forgotten" in reply.summary  # the node is cordoned
    entry = audit.recent(services.database, 1)[0]
    assert (entry.action, entry.target, entry.actor) == ("node.note", "gpu-a-02", "U0OPS")
    shown = dispatch("node gpu-a-02", actor=CONFIG.actor("U0VIC"), services=services, now=NOW)
    assert "Notes" in text_of(shown) and '"waiting for a new PSU (ticket HW-123)"' in text_of(shown)
    later = dispatch("node gpu-a-02", actor=CONFIG.actor("U0VIC"), services=services,
                     now=NOW + dt.timedelta(days=3, minutes=1))
    assert "waiting for a new PSU" not in text_of(later)  # ended by itself


def test_a_note_asked_again_by_the_delivery_that_wrote_it_is_answered_with_that_note_not_written_twice(
        make, tmp_path):
    # The delivery run again by another replica: the one that wrote the note died before answering.
    services = services_for(make, tmp_path, three_nodes(make))
    same = Services.on_database(config=CONFIG, fleet=services.fleet, database=services.database,
                                delivery="/gpu:U0OPS:1001.1")
    words = "note gpu-a-02 waiting for parts for 3d"
    first = dispatch(words, actor=CONFIG.actor("U0OPS"), services=same, now=NOW)
    again = dispatch(words, actor=CONFIG.actor("U0OPS"), services=same, now=NOW + dt.timedelta(seconds=15))

    assert first.ok and again.ok and again.summary == first.summary
    assert len(stored_notes.in_force(services.database, now=NOW + dt.timedelta(seconds=15))) == 1
    assert [e.action for e in audit.recent(services.database, 5)].count("node.note") == 1


def test_a_note_without_for_holds_seven_days_and_for_parts_stays_text(make, tmp_path):
    services = services_for(make, tmp_path, three_nodes(make))
    reply = dispatch("note gpu-a-02 waiting for parts", actor=CONFIG.actor("U0OPS"), services=services, now=NOW)

    assert reply.ok, text_of(reply)
    [note] = stored_notes.in_force(services.database, now=NOW)
    assert note.text == "waiting for parts"
    assert note.until == NOW + dt.timedelta(days=7)


def test_bad_notes_say_what_is_wrong_and_store_nothing(make, tmp_path):
    services = services_for(make, tmp_path, three_nodes(make))
    ops, viewer = CONFIG.actor("U0OPS"), CONFIG.actor("U0VIC")

    unknown = dispatch("note gpu-a-2 waiting", actor=ops, services=services, now=NOW)
    bad_duration = dispatch("note gpu-a-02 waiting for 3x", actor=ops, services=services, now=NOW)
    too_long = dispatch("note gpu-a-02 waiting for 400d", actor=ops, services=services, now=NOW)
    empty = dispatch("note gpu-a-02 for 3d", actor=ops, services=services, now=NOW)
    no_role = dispatch("note gpu-a-02 waiting", actor=viewer, services=services, now=NOW)

    assert not unknown.ok and "No GPU node named `gpu-a-2`. Closest: `gpu-a-02`" in text_of(unknown)
    assert not bad_duration.ok and "`3x` after `for` is not a duration" in text_of(bad_duration)
    assert not too_long.ok and "at most 90 days" in text_of(too_long)
    assert not empty.ok and "say why in the note" in text_of(empty)
    assert not no_role.ok and "operator" in text_of(no_role)
    assert stored_notes.in_force(services.database, now=NOW) == []
    assert [e for e in audit.recent(services.database, 10) if e.action == "node.note"] == []


# --------------------------------------------------------------------------------------
# Restrictions nobody remembers


def findings_at(services: Services, now: dt.datetime, scope: str = "gpu-a-02") -> str:
    return "\n".join(codes(dispatch(f"findings {scope}", actor=CONFIG.actor("U0VIC"), services=services, now=now)))


def test_a_hand_cordon_is_forgotten_only_after_seven_days_from_when_gpuops_first_saw_it(make, tmp_path):
    services = services_for(make, tmp_path, three_nodes(make))
    with freeze_time(NOW) as clock:
        first = findings_at(services, dt.datetime.now(dt.timezone.utc))
        clock.tick(dt.timedelta(days=6, hours=23))
        young = findings_at(services, dt.datetime.now(dt.timezone.utc))
        clock.tick(dt.timedelta(hours=2))
        old = findings_at(services, dt.datetime.now(dt.timezone.utc))

    assert "cordoned by hand" not in first and "cordoned by hand" not in young
    assert "gpu-a-02 (8 GPUs) has been cordoned by hand for at least 7d 1h, with no gpuops run on it and no note" \
        in old
    assert "/gpu note gpu-a-02" in old


def test_a_note_silences_the_forgotten_cordon_until_it_ends(make, tmp_path):
    services = services_for(make, tmp_path, three_nodes(make))
    with freeze_time(NOW) as clock:
        findings_at(services, dt.datetime.now(dt.timezone.utc))  # first seen
        clock.tick(dt.timedelta(days=8))
        dispatch("note gpu-a-02 RMA pending for 2d", actor=CONFIG.actor("U0OPS"), services=services,
                 now=dt.datetime.now(dt.timezone.utc))
        noted = findings_at(services, dt.datetime.now(dt.timezone.utc))
        clock.tick(dt.timedelta(days=2, minutes=1))
        ended = findings_at(services, dt.datetime.now(dt.timezone.utc))

    assert "cordoned by hand" not in noted
    assert "cordoned by hand for at least 10d" in ended


def test_a_persons_taint_is_forgotten_but_a_taint_the_whole_pool_carries_is_not(make, tmp_path):
    pool_wide = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    nodes = [dataclasses.replace(make.node("gpu-a-01"), taints=(pool_wide,)),
             dataclasses.replace(make.node("gpu-a-02"), taints=(pool_wide, PERSON_TAINT)),
             dataclasses.replace(make.node("gpu-a-03"), taints=(pool_wide,))]
    services = services_for(make, tmp_path, nodes)
    with freeze_time(NOW) as clock:
        findings_at(services, dt.datetime.now(dt.timezone.utc), scope="train-a")
        clock.tick(dt.timedelta(days=8))
        old = findings_at(services, dt.datetime.now(dt.timezone.utc), scope="train-a")

    assert "gpu-a-02 has been tainted team=alice:NoSchedule for at least 8d" in old
    assert "nvidia.com/gpu=present" not in old
    assert "gpu-a-01" not in old and "gpu-a-03" not in old


def test_what_a_person_set_by_hand_counts_but_the_pool_label_and_what_every_node_carries_alike(make):
    def by_hand(what, key, value):
        return HandSet(what=what, key=key, value=value, manager="kubectl-label", at=None)

    found = [by_hand("label", "team", "vision"), by_hand("label", "site", "a"), by_hand("label", "gpuops.io/pool", "x"),
             by_hand("annotation", "ops.example/why", "a long reason"),
             by_hand("taint", "team", "team=alice:NoSchedule")]
    pool = [make.node("gpu-a-01", labels={"team": "vision", "site": "a"}), make.node("gpu-a-02", labels={"site": "a"})]

    assert hand_set_marks(found, pool_label="gpuops.io/pool", pool_nodes=pool) == (
        "annotation ops.example/why", "label team=vision")
    # Alone in its pool, nothing is the pool's design but its label.
    assert hand_set_marks(found, pool_label="gpuops.io/pool", pool_nodes=pool[:1]) == (
        "annotation ops.example/why", "label site=a", "label team=vision")


def test_forgotten_after_is_read_from_the_configuration(make, tmp_path):
    config = GpuopsConfig.model_validate({**CONFIG_VALUES, "inventory": {"forgotten_after": "1d"}})
    services = services_for(make, tmp_path, three_nodes(make), config=config)
    with freeze_time(NOW) as clock:
        findings_at(services, dt.datetime.now(dt.timezone.utc))
        clock.tick(dt.timedelta(days=1, hours=1))
        old = findings_at(services, dt.datetime.now(dt.timezone.utc))

    assert "cordoned by hand for at least 1d 1h" in old


# --------------------------------------------------------------------------------------
# /gpu compare and the pool's status


def drifting(make) -> list[NodeObject]:
    info = make.node("gpu-a-01").info
    return [
        make.node("gpu-a-01", labels={"team": "ml"}),
        make.node("gpu-a-02", labels={"team": "ml"}),
        dataclasses.replace(make.node("gpu-a-03", labels={"team": "infra"}), taints=(PERSON_TAINT,),
                            info=dataclasses.replace(info, kernel_version="6.8.0-1015-nvidia")),
        make.node("gpu-a-04", labels={"team": "ml"}),
    ]


def test_compare_groups_the_nodes_that_differ_from_the_majority_by_property(make, tmp_path):
    nodes = [dataclasses.replace(n, labels={**n.labels, "kubernetes.io/hostname": n.name}) for n in drifting(make)]
    services = services_for(make, tmp_path, nodes)
    reply = dispatch("compare train-a", actor=CONFIG.actor("U0VIC"), services=services, now=NOW)
    shown = text_of(reply)

    assert "1 of 4 nodes of train-a differ from the pool's majority in 3 properties" in shown
    assert "label team | ml | infra on gpu-a-03" in shown
    assert "taints | (none) | team=alice:NoSchedule on gpu-a-03" in shown
    assert "kernel | " in shown and "6.8.0-1015-nvidia on gpu-a-03" in shown
    assert "label kubernetes.io/hostname" not in shown  # a node's own label is not drift
    assert "watch cache" in shown


def test_compare_shows_every_operands_version_and_a_node_missing_an_operand(make, tmp_path):
    nodes = drifting(make)

    def operands(node: str, *, exporter: str | None = "3.3.9-4.1.1-ubuntu22.04") -> list[PodObject]:
        pods = [*make.operands(node),
                make.pod(node=node, labels={"app": "nvidia-container-toolkit-daemonset"},
                         image="nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04"),
                make.pod(node=node, labels={"app": "gpu-feature-discovery"},
                         image="nvcr.io/nvidia/k8s-device-plugin:v0.17.2")]
        if exporter is not None:
            pods.append(make.pod(node=node, labels={"app": "nvidia-dcgm-exporter"},
                                 image=f"nvcr.io/nvidia/k8s/dcgm-exporter:{exporter}"))
        return pods

    pods_of = {"gpu-a-01": operands("gpu-a-01"), "gpu-a-02": operands("gpu-a-02", exporter="4.2.3-4.1.3-ubuntu22.04"),
               "gpu-a-03": operands("gpu-a-03"), "gpu-a-04": operands("gpu-a-04", exporter=None)}
    services = services_for(make, tmp_path, nodes, pods_of=pods_of)
    shown = text_of(dispatch("compare train-a", actor=CONFIG.actor("U0VIC"), services=services, now=NOW))

    assert ("nvidia-dcgm-exporter image | 3.3.9-4.1.1-ubuntu22.04 | (none) on gpu-a-04; "
            "4.2.3-4.1.3-ubuntu22.04 on gpu-a-02") in shown
    # The same version on every node is no drift.
    assert "nvidia-container-toolkit-daemonset image" not in shown
    assert "gpu-feature-discovery image" not in shown


def test_the_pools_status_shows_its_policy_as_plans_apply_it_and_its_drift(make, tmp_path):
    services = services_for(make, tmp_path, drifting(make))
    shown = text_of(dispatch("status train-a", actor=CONFIG.actor("U0VIC"), services=services, now=NOW))

    assert "Windows: any time (windows: always)" in shown
    assert "Approvals: drain 0, upgrade 1, mig 1, migrate 1" in shown
    assert "Approvers: ann and the fleet's approvers" in shown
    assert "Max unavailable: 50% (2 of 4 nodes now)" in shown
    assert "Capacity floor: 8 GPUs stay Ready" in shown
    assert "Canary: gpu-a-01 first, then 15m soak before the next wave" in shown
    assert "GPU check: `nvidia-smi` in nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04 (upgrades.gpu_check)" in shown
    assert "Drift in pool train-a" in shown and "label team | ml | infra on gpu-a-03" in shown


# --------------------------------------------------------------------------------------
# Pods that tolerate their way around a pool's placement


def test_a_pod_the_placement_does_not_take_that_tolerates_the_pools_taint_is_a_finding(make, tmp_path):
    config = GpuopsConfig.model_validate({**CONFIG_VALUES, "pools": {"train-a": {
        **CONFIG_VALUES["pools"]["train-a"], "workloads": {"full_gpu": {"namespaces": ["training"]}}}}})
    dedicated = Taint(key="dedicated", value="training", effect="NoSchedule")
    nodes = [dataclasses.replace(make.node(f"gpu-a-0{i}"), taints=(dedicated,)) for i in (1, 2)]
    sneaky = dataclasses.replace(make.workload("gpu-a-01", gpus=8, namespace="ml", name="sweep-0"),
                                 placement=Placement(tolerations=(Toleration(key="", operator="Exists", value="",
                                                                             effect=""),)))
    invited = dataclasses.replace(make.workload("gpu-a-02", gpus=8, namespace="training", name="train-0"),
                                  placement=Placement(tolerations=(Toleration(key="dedicated", operator="Equal",
                                                                              value="training", effect="NoSchedule"),)))
    services = services_for(make, tmp_path, nodes, config=config, extra_pods=[sneaky, invited])
    shown = findings_at(services, NOW, scope="train-a")

    assert ("ml/sweep-0 holds whole GPUs on gpu-a-01 by a toleration of every taint, though pool train-a keeps "
            "whole GPUs for namespace training (workloads.full_gpu): its taint does not keep the pod out") in shown
    assert "train-0" not in shown


def test_compare_without_node_objects_compares_the_inventory_and_says_labels_were_not(make, tmp_path):
    nodes = drifting(make)
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])
    services = Services.on_database(config=CONFIG, fleet=StaticFleet(fleet), database=open_database(
        tmp_path / "gpuops.db"))
    shown = text_of(dispatch("compare train-a", actor=CONFIG.actor("U0VIC"), services=services, now=NOW))

    assert "kernel | " in shown and "6.8.0-1015-nvidia on gpu-a-03" in shown
    assert "label team" not in shown
    assert "labels and taints are not compared here" in shown


def test_with_no_value_held_by_most_nodes_compare_says_there_is_no_majority():
    found = drift_of("kernel", {NodeName("a"): "6.8", NodeName("b"): "6.5"})
    assert found is not None and found.majority is None
    assert found.others == (("6.5", ("b",)), ("6.8", ("a",)))


def test_a_person_cordon_first_seen_by_the_watch_keeps_its_age_across_a_restart(make, tmp_path):
    db = open_database(tmp_path / "gpuops.db")
    inv = make.fleet([make.node("gpu-a-02", unschedulable=True)]).nodes[NodeName("gpu-a-02")]
    FirstSeen(lambda: db).stamp_restrictions(inv, None, NOW)
    again = FirstSeen(lambda: db).stamp_restrictions(inv, None, NOW + dt.timedelta(days=3))

    assert again[(CORDON, NodeName("gpu-a-02"))] == NOW
