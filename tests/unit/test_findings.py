"""Findings: what an on-call engineer is told about the fleet, how loudly, and where to look."""

from __future__ import annotations

import datetime as dt

import pytest

from storage.database import open_database
from workflows.fleet.settings import InventorySettings
from workflows.fleet.findings import format_age, node_findings
from workflows.fleet.first_seen import FirstSeen


def codes(findings) -> list[tuple[str, str, str]]:
    return [(f.severity, f.code, f.subject) for f in findings]


def only(findings, code):
    (finding,) = [f for f in findings if f.code == code]
    return finding


def since(make, **delta) -> str:
    return (make.now - dt.timedelta(**delta)).isoformat().replace("+00:00", "Z")


def test_a_healthy_pooled_fleet_with_the_operator_in_charge_has_nothing_to_report(make):
    nodes = [make.node("gpu-1"), make.node("gpu-2")]

    fleet = make.fleet(nodes, make.operands("gpu-1") + make.operands("gpu-2"))

    assert fleet.findings == ()


# ------------------------------------------------------------------ advertised GPUs


def test_a_node_advertising_fewer_gpus_than_it_has_is_critical(make):
    node = make.node("gpu-h100-07", gpus=8, capacity={"nvidia.com/gpu": "6"})

    finding = only(make.fleet([node], make.operands(node.name)).findings, "advertised-mismatch")

    assert finding.severity == "critical"
    assert finding.subject == "gpu-h100-07" and finding.pool == "train-a"
    assert "advertises 6 of 8 nvidia.com/gpu" in finding.message
    assert finding.command == "/gpu node gpu-h100-07"


def test_missing_gpus_while_operands_are_paused_are_only_informational(make):
    node = make.node(
        capacity={"nvidia.com/gpu": "0"},
        labels={
            "nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
            "nvidia.com/gpu-driver-upgrade-state": "pod-restart-required",
        },
    )
    pods = [make.driver_pod(node.name), make.validator_pod(node.name)]

    finding = only(make.fleet([node], pods).findings, "advertised-mismatch")

    assert finding.severity == "info"
    assert "device-plugin=paused-for-driver-upgrade" in finding.message


def test_missing_gpus_mid_upgrade_without_paused_operands_are_a_warning(make):
    node = make.node(
        capacity={"nvidia.com/gpu": "4"},
        labels={"nvidia.com/gpu-driver-upgrade-state": "validation-required"},
    )

    finding = only(make.fleet([node], make.operands(node.name)).findings, "advertised-mismatch")

    assert finding.severity == "warning"
    assert "during driver upgrade state validation-required" in finding.message


def test_a_node_advertising_more_than_its_labels_imply_is_a_warning(make):
    node = make.node(gpus=4, capacity={"nvidia.com/gpu": "16"})

    finding = only(make.fleet([node], make.operands(node.name)).findings, "advertised-mismatch")

    assert finding.severity == "warning"
    assert "16 of 4 nvidia.com/gpu" in finding.message
    assert "sharing config" in finding.message


def test_a_time_sliced_node_advertising_count_times_replicas_is_healthy(make):
    node = make.node(
        gpus=2,
        labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        capacity={"nvidia.com/gpu": None, "nvidia.com/gpu.shared": "8"},
    )

    assert make.fleet([node], make.operands(node.name)).findings == ()


def test_a_mixed_mig_profile_short_of_its_count_is_reported_by_profile(make):
    node = make.node(
        gpus=1,
        labels={
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig-1g.10gb.count": "7",
        },
        capacity={"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": "5"},
    )

    finding = only(make.fleet([node], make.operands(node.name)).findings, "advertised-mismatch")

    assert finding.severity == "critical"
    assert "5 of 7 nvidia.com/mig-1g.10gb" in finding.message


def test_devices_marked_unhealthy_by_the_device_plugin_are_a_warning(make):
    node = make.node(gpus=8, allocatable={"nvidia.com/gpu": "7"})

    findings = make.fleet([node], make.operands(node.name)).findings

    assert codes(findings) == [("warning", "unhealthy-gpus", node.name)]
    assert "7 of 8 nvidia.com/gpu allocatable" in findings[0].message


def test_a_ready_device_plugin_on_a_node_advertising_no_gpus_is_critical_once(make):
    node = make.node(gpus=8, capacity={"nvidia.com/gpu": "0"})

    findings = make.fleet([node], make.operands(node.name)).findings

    assert codes(findings) == [("critical", "device-plugin-no-gpus", node.name)]
    assert "device plugin on gpu-h100-01 is Ready but the node advertises 0 GPUs" in findings[0].message


# ------------------------------------------------------------------ driver


def test_two_driver_sources_are_critical_and_not_also_reported_as_a_crash_loop(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    driver = make.driver_pod(
        node.name, name="nvidia-driver-daemonset-x", ready=False, restarts=9,
        waiting_reason="CrashLoopBackOff", last_terminated_reason="Error",
    )

    findings = make.fleet([node], [driver, make.device_plugin_pod(node.name)]).findings

    assert codes(findings) == [("critical", "driver-conflict", node.name)]
    assert "gpu-operator/nvidia-driver-daemonset-x is CrashLoopBackOff (9 restarts)" in findings[0].message


@pytest.mark.parametrize(
    "pod_state",
    [
        {"waiting_reason": "CrashLoopBackOff", "restarts": 3},
        {"restarts": 5, "last_terminated_reason": "Error"},
    ],
)
def test_a_crash_looping_operator_driver_pod_is_critical(make, pod_state):
    node = make.node()
    driver = make.driver_pod(node.name, ready=False, **pod_state)

    findings = make.fleet([node], [driver, make.device_plugin_pod(node.name)]).findings

    assert ("critical", "driver-crash-loop", node.name) in codes(findings)


def test_a_driver_pod_that_restarted_cleanly_is_not_a_crash_loop(make):
    node = make.node()
    driver = make.driver_pod(node.name, restarts=7, last_terminated_reason="Completed")

    assert make.fleet([node], [driver, make.device_plugin_pod(node.name)]).findings == ()


# ------------------------------------------------------------------ upgrades


def test_a_node_in_an_upgrade_state_longer_than_allowed_is_a_warning(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"},
        annotations={"gpuops.io/upgrade-state-since": since(make, hours=26)},
    )

    finding = only(make.fleet([node], make.operands(node.name)).findings, "upgrade-stuck")

    assert finding.severity == "warning"
    assert "in driver upgrade state upgrade-required for 1d 2h" in finding.message


def test_a_node_within_the_allowed_upgrade_time_is_not_reported(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required"},
        annotations={"gpuops.io/upgrade-state-since": since(make, minutes=20)},
    )

    assert make.fleet([node], make.operands(node.name)).findings == ()


def test_the_stuck_threshold_for_upgrades_comes_from_settings(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required"},
        annotations={"gpuops.io/upgrade-state-since": since(make, minutes=20)},
    )
    settings = InventorySettings(upgrade_stuck_after=dt.timedelta(minutes=15))

    findings = make.fleet([node], make.operands(node.name), settings=settings).findings

    assert codes(findings) == [("warning", "upgrade-stuck", node.name)]


def test_upgrade_done_is_never_stuck(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
        annotations={"gpuops.io/upgrade-state-since": since(make, days=40)},
    )

    assert make.fleet([node], make.operands(node.name)).findings == ()


def test_a_failed_upgrade_is_critical_as_soon_as_it_is_seen(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"},
        annotations={"gpuops.io/upgrade-state-since": since(make, minutes=2)},
    )

    finding = only(make.fleet([node], make.operands(node.name)).findings, "upgrade-failed")

    assert finding.severity == "critical"
    assert "upgrade-failed for 2m" in finding.message


# ------------------------------------------------------------------ MIG


def mig_node(make, *, state, annotations=None, advertised="0"):
    return make.node(
        labels={
            "nvidia.com/mig.config": "all-1g.10gb",
            "nvidia.com/mig.config.state": state,
            "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
            "nvidia.com/gpu.deploy.gpu-feature-discovery": "paused-for-mig-change",
        },
        annotations=annotations or {},
        capacity={"nvidia.com/gpu": advertised},
    )


def test_a_mig_change_pending_longer_than_allowed_is_critical(make):
    node = mig_node(make, state="pending", annotations={"gpuops.io/mig-state-since": since(make, minutes=45)})

    findings = make.fleet([node], [make.driver_pod(node.name)]).findings

    assert codes(findings) == [("critical", "mig-change-stuck", node.name)]
    message = findings[0].message
    assert "to all-1g.10gb is stuck (pending for 45m)" in message
    assert "device-plugin, gpu-feature-discovery paused" in message


def test_a_mig_change_still_within_its_time_is_only_noted_as_expected(make):
    node = mig_node(make, state="rebooting", annotations={"gpuops.io/mig-state-since": since(make, minutes=5)})

    findings = make.fleet([node], [make.driver_pod(node.name)]).findings

    assert codes(findings) == [("info", "advertised-mismatch", node.name)]


def test_a_paused_mig_change_with_no_known_start_is_not_called_stuck_at_once(make):
    # Outside the simulator nothing on the node says when a change began.
    node = mig_node(make, state="success")

    findings = make.fleet([node], [make.driver_pod(node.name)]).findings

    assert "mig-change-stuck" not in [f.code for f in findings]


def first_seen_on(tmp_path):
    db = open_database(tmp_path / "gpuops.db")
    return db, FirstSeen(lambda: db)


def test_gpuops_ages_a_mig_change_from_when_it_first_saw_it_and_remembers_that_across_a_restart(make, tmp_path):
    db, first_seen = first_seen_on(tmp_path)
    settings = InventorySettings()
    started = first_seen.stamp(make.assess(mig_node(make, state="pending"), [make.driver_pod("gpu-h100-01")]),
                               make.now)

    just_now = node_findings(started, settings=settings, now=make.now + dt.timedelta(minutes=1))
    assert "mig-change-stuck" not in [f.code for f in just_now]

    restarted = FirstSeen(lambda: db)  # a new process on the same database
    again = restarted.stamp(make.assess(mig_node(make, state="pending"), [make.driver_pod("gpu-h100-01")]),
                            make.now + dt.timedelta(minutes=40))
    assert again.mig.since == make.now
    later = node_findings(again, settings=settings, now=make.now + dt.timedelta(minutes=40))
    assert codes(later)[0] == ("critical", "mig-change-stuck", "gpu-h100-01")
    assert "(pending for 40m)" in later[0].message

    # A new state starts a new age.
    moved = restarted.stamp(make.assess(mig_node(make, state="rebooting"), [make.driver_pod("gpu-h100-01")]),
                            make.now + dt.timedelta(minutes=41))
    assert moved.mig.since == make.now + dt.timedelta(minutes=41)
    db.close()


def test_a_node_waiting_in_upgrade_required_gets_a_finding_once_it_has_waited_too_long(make, tmp_path):
    db, first_seen = first_seen_on(tmp_path)
    node = make.node(labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"})
    seen = first_seen.stamp(make.assess(node), make.now)

    assert node_findings(seen, settings=InventorySettings(), now=make.now + dt.timedelta(minutes=5)) == ()
    late = node_findings(seen, settings=InventorySettings(), now=make.now + dt.timedelta(hours=3))
    assert codes(late) == [("warning", "upgrade-stuck", node.name)]
    assert "upgrade-required for 3h" in late[0].message
    # Back to done: forgotten, so a later upgrade is aged afresh.
    done = make.node(labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    first_seen.stamp(make.assess(done), make.now + dt.timedelta(hours=4))
    assert first_seen.stamp(make.assess(node), make.now + dt.timedelta(hours=5)).upgrade.since == (
        make.now + dt.timedelta(hours=5))
    db.close()


def test_each_cluster_ages_its_own_nodes_states_though_two_clusters_name_a_node_alike(make, tmp_path):
    db = open_database(tmp_path / "gpuops.db")
    home, west = FirstSeen(lambda: db), FirstSeen(lambda: db, cluster="west")
    required = make.assess(make.node("gpu-1", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}))

    assert home.stamp(required, make.now).upgrade.since == make.now
    # West's gpu-1 is another machine: its upgrade is aged from when gpuops saw it there.
    assert west.stamp(required, make.now + dt.timedelta(hours=2)).upgrade.since == make.now + dt.timedelta(hours=2)
    done = make.assess(make.node("gpu-1", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}))
    west.stamp(done, make.now + dt.timedelta(hours=3))  # west's is done: forgotten there only

    # Across a restart each reads its own records back, and the home cluster's stay where
    # a gpuops of one cluster kept them (the plain node name).
    home_again, west_again = FirstSeen(lambda: db), FirstSeen(lambda: db, cluster="west")
    assert home_again.stamp(required, make.now + dt.timedelta(hours=4)).upgrade.since == make.now
    assert west_again.stamp(required, make.now + dt.timedelta(hours=4)).upgrade.since == (
        make.now + dt.timedelta(hours=4))
    db.close()


def test_a_failed_mig_change_is_critical(make):
    node = make.node(labels={"nvidia.com/mig.config.state": "failed", "nvidia.com/mig.config": "all-3g.40gb"})

    finding = only(make.fleet([node], make.operands(node.name)).findings, "mig-change-failed")

    assert finding.severity == "critical"
    assert "to all-3g.40gb failed" in finding.message


# ------------------------------------------------------------------ nodes


def test_a_not_ready_gpu_node_is_a_warning_with_how_long(make):
    node = make.node(ready=False, ready_changed_at=make.now - dt.timedelta(minutes=90))

    finding = only(make.fleet([node], make.operands(node.name)).findings, "node-not-ready")

    assert finding.severity == "warning"
    assert "is NotReady for 1h 30m" in finding.message


def test_node_findings_can_be_computed_for_one_node_on_its_own(make):
    node = make.node(ready=None)
    inventory = make.assess(node)

    findings = node_findings(inventory, settings=InventorySettings(), now=make.now)

    assert codes(findings) == [("warning", "node-not-ready", node.name)]
    assert "reports no Ready condition" in findings[0].message


# ------------------------------------------------------------------ pools


def test_a_serving_pool_that_upgrades_its_driver_on_its_own_is_a_warning(make):
    settings = InventorySettings(pool_kinds={"serving-a": "serving", "train-a": "training"})
    policy = make.cluster_policy(driver={"upgradePolicy": {"autoUpgrade": True}})
    nodes = [make.node("s", pool="serving-a"), make.node("t", pool="train-a")]
    pods = make.operands("s") + make.operands("t")

    findings = make.fleet(nodes, pods, settings=settings, policies=[policy]).findings

    assert codes(findings) == [("warning", "serving-auto-upgrade", "serving-a")]
    assert "auto-upgrade on (ClusterPolicy cluster-policy)" in findings[0].message
    assert findings[0].command == "/gpu status serving-a"


def test_a_serving_pool_under_an_nvidia_driver_that_defaults_to_auto_upgrade_is_a_warning(make):
    settings = InventorySettings(pool_kinds={"serving-a": "serving"})
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})
    node = make.node("s", pool="serving-a", labels={"nvidia.com/gpu-operator.driver.owner": "h100-driver"})

    findings = make.fleet(
        [node], make.operands("s"), settings=settings, policies=[policy],
        nvidia_drivers=[make.nvidia_driver("h100-driver", node_selector={"gpuops.io/pool": "serving-a"})],
    ).findings

    finding = only(findings, "serving-auto-upgrade")
    assert "(NVIDIADriver h100-driver (CRD default))" in finding.message


def test_a_pool_running_two_driver_versions_is_a_warning(make):
    nodes = [make.node("a"), make.node("b", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"})]
    pods = make.operands("a") + [
        make.driver_pod("b", version="570.172.08"),
        make.device_plugin_pod("b"),
        make.validator_pod("b"),
    ]

    finding = only(make.fleet(nodes, pods).findings, "mixed-driver-versions")

    assert finding.severity == "warning"
    assert ("570.172.08 (1 node, operator-installed), 580.95.05 (1 node, operator-installed); "
            "finish or roll back the upgrade") in finding.message


def test_a_version_mix_that_comes_from_host_installed_drivers_says_so_not_finish_the_upgrade(make):
    nodes = [make.node("a"), make.node("b", labels={"nvidia.com/cuda.driver-version.full": "550.54.15",
                                                    "nvidia.com/gpu.deploy.driver": "false"})]
    pods = make.operands("a") + [make.device_plugin_pod("b"), make.validator_pod("b")]
    fleet = make.fleet(nodes, pods)
    assert fleet.nodes["b"].driver.owner == "host"

    finding = only(fleet.findings, "mixed-driver-versions")

    assert "550.54.15 (1 node, host-installed), 580.95.05 (1 node, operator-installed)" in finding.message
    assert "the mix comes from host-installed drivers, not an upgrade in flight" in finding.message
    assert "finish or roll back" not in finding.message


def test_a_version_mix_with_a_host_driver_on_a_version_the_operator_also_runs_is_no_upgrade_to_finish(make):
    nodes = [make.node("a"), make.node("b", labels={"nvidia.com/cuda.driver-version.full": "570.172.08",
                                                    "nvidia.com/gpu.deploy.driver": "false"}),
             make.node("c", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"})]
    pods = make.operands("a") + [make.device_plugin_pod("b"), make.validator_pod("b"),
                                 make.driver_pod("c", version="570.172.08"), make.device_plugin_pod("c"),
                                 make.validator_pod("c")]
    fleet = make.fleet(nodes, pods)
    assert fleet.nodes["b"].driver.owner == "host"

    finding = only(fleet.findings, "mixed-driver-versions")

    assert "570.172.08 (2 nodes, host/operator-installed)" in finding.message, finding.message
    assert "finish or roll back" not in finding.message


def test_unpooled_gpu_nodes_are_reported_once_with_their_count(make):
    nodes = [make.node("a", pool=None), make.node("b", pool=None), make.node("c")]

    findings = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)]).findings

    assert codes(findings) == [("info", "unpooled-nodes", "unpooled")]
    assert findings[0].message.startswith("2 GPU nodes have no gpuops.io/pool label")


# ------------------------------------------------------------------ cluster


def test_duplicate_cluster_policies_are_a_warning_naming_the_ignored_ones(make):
    policies = [make.cluster_policy(), make.cluster_policy("old-policy", state="ignored")]

    findings = make.fleet([make.node()], make.operands("gpu-h100-01"), policies=policies).findings

    assert codes(findings) == [("warning", "duplicate-cluster-policy", "cluster")]
    assert "uses cluster-policy and ignores old-policy" in findings[0].message


def test_a_cluster_policy_that_is_not_ready_is_a_warning(make):
    policy = make.cluster_policy(state="notReady")

    findings = make.fleet([make.node()], make.operands("gpu-h100-01"), policies=[policy]).findings

    assert codes(findings) == [("warning", "cluster-policy-not-ready", "cluster")]


def test_a_cluster_without_the_gpu_operator_gets_a_clear_answer(make):
    findings = make.fleet([make.node()], [], operator=False, crds=False).findings

    finding = only(findings, "no-gpu-operator")
    assert finding.severity == "info"
    assert finding.message.startswith("no GPU Operator found: the ClusterPolicy CRD")


def test_crds_without_an_operator_deployment_is_also_no_gpu_operator(make):
    findings = make.fleet([make.node()], [], operator=False, crds=True).findings

    assert only(findings, "no-gpu-operator").message.startswith(
        "no GPU Operator found: the ClusterPolicy CRD is installed but no gpu-operator Deployment"
    )


# ------------------------------------------------------------------ order and wording


def test_findings_come_critical_first_then_warning_then_info_and_by_subject(make):
    nodes = [
        make.node("b-node", pool=None, allocatable={"nvidia.com/gpu": "7"}),
        make.node("a-node", capacity={"nvidia.com/gpu": "3"}),
        make.node("c-node", capacity={"nvidia.com/gpu": "2"}),
    ]
    pods = [p for n in nodes for p in make.operands(n.name)]

    findings = make.fleet(nodes, pods).findings

    assert codes(findings) == [
        ("critical", "advertised-mismatch", "a-node"),
        ("critical", "advertised-mismatch", "c-node"),
        ("warning", "unhealthy-gpus", "b-node"),
        ("info", "unpooled-nodes", "unpooled"),
    ]


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (dt.timedelta(seconds=30), "30s"),
        (dt.timedelta(minutes=45), "45m"),
        (dt.timedelta(hours=2), "2h"),
        (dt.timedelta(hours=2, minutes=5), "2h 5m"),
        (dt.timedelta(days=3, hours=4, minutes=59), "3d 4h"),
    ],
)
def test_ages_are_shown_in_the_two_largest_units(age, text):
    assert format_age(age) == text


def test_driver_pods_older_than_their_daemonset_are_counted_per_pool_with_the_version_they_will_get(make):
    new = "580.105.08"
    nodes = [make.node("a"), make.node("b"), make.node("c")]
    pods = [make.driver_pod("a"), make.device_plugin_pod("a"), make.validator_pod("a"),
            make.driver_pod("b"), make.device_plugin_pod("b"), make.validator_pod("b"),
            make.driver_pod("c", version=new, generation="2"), make.device_plugin_pod("c"), make.validator_pod("c")]

    fleet = make.fleet(nodes, pods, driver_templates=[make.driver_template(version=new, generation="2")])

    finding = only(fleet.findings, "driver-pods-behind-template")
    assert (finding.severity, finding.subject) == ("warning", "train-a")
    assert finding.message.startswith(
        f"2 of 3 nodes (a, b) run a driver pod older than its DaemonSet, which now specifies {new}: with OnDelete")
    assert fleet.nodes["a"].driver_pod.template_version == new
    assert fleet.nodes["c"].driver_pod.template_version is None
    assert dict(fleet.pool("train-a").driver_pods_behind) == {new: ("a", "b")}


def test_a_template_changed_and_changed_back_is_not_behind_and_unknown_templates_say_nothing(make):
    nodes = [make.node("a")]
    pods = make.operands("a")
    # Generation 3 (changed twice) with the pod's own image again: its next restart changes nothing.
    reverted = make.fleet(nodes, pods, driver_templates=[make.driver_template(generation="3")])
    unknown = make.fleet(nodes, pods)

    for fleet in (reverted, unknown):
        assert fleet.nodes["a"].driver_pod.template_version is None
        assert "driver-pods-behind-template" not in {f.code for f in fleet.findings}


def test_pods_behind_a_daemonset_whose_version_failed_somewhere_are_critical_and_named_at_risk(make):
    # The canary (c) took the new version and its driver crash-loops; the object still names
    # it, so a and b take it on their pods' next restart.
    new = "580.105.08"
    nodes = [make.node("a"), make.node("b"), make.node("c")]
    pods = [*make.operands("a"), *make.operands("b"),
            make.driver_pod("c", version=new, generation="2", ready=False, waiting_reason="CrashLoopBackOff",
                            restarts=6),
            make.device_plugin_pod("c"), make.validator_pod("c")]

    fleet = make.fleet(nodes, pods, driver_templates=[make.driver_template(version=new, generation="2")])

    finding = only(fleet.findings, "driver-pods-behind-template")
    assert (finding.severity, finding.subject) == ("critical", "train-a")
    assert finding.message.startswith(f"driver {new} failed on c, yet the DaemonSet still specifies it: "
                                      "2 of 3 nodes at risk (a, b)"), finding.message
