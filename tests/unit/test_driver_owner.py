"""Who owns the driver on a node (`workflows.fleet.driver_owner`): the operator, the host,
both (a conflict), none or unknown, each with the evidence an on-call engineer reads."""

from __future__ import annotations

import datetime as dt

from workflows.kube.objects import NodeName

H100_CR_LABEL = "nvidia.com/gpu-operator.driver.owner"


def evidence_text(inventory) -> str:
    return " | ".join(inventory.driver.evidence)


def test_a_ready_operator_driver_pod_means_the_operator_owns_the_driver(make):
    node = make.node("gpu-h100-01")
    driver = make.driver_pod("gpu-h100-01", name="nvidia-driver-daemonset-abc")

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "operator"
    assert (
        "driver pod gpu-operator/nvidia-driver-daemonset-abc is Running and Ready "
        "(image tag 580.95.05-ubuntu22.04)"
    ) in inv.driver.evidence
    assert inv.driver_image_tag == "580.95.05-ubuntu22.04"
    assert inv.driver_pod.version == "580.95.05"
    assert inv.driver_version == "580.95.05"


def test_a_pre_installed_label_without_a_driver_pod_means_the_host_owns_the_driver(make):
    node = make.node(
        labels={
            "nvidia.com/gpu.deploy.driver": "pre-installed",
            "nvidia.com/cuda.driver-version.full": "570.172.08",
        }
    )

    inv = make.assess(node, [make.device_plugin_pod(node.name)])

    assert inv.driver.owner == "host"
    assert "label nvidia.com/gpu.deploy.driver=pre-installed" in inv.driver.evidence
    assert "GFD reports driver 570.172.08" in inv.driver.evidence
    assert inv.driver_pod.text == "missing"


def test_a_driver_disabled_in_the_cluster_policy_with_a_working_driver_is_a_host_driver(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": "570.172.08"})

    inv = make.assess(
        node,
        [make.device_plugin_pod(node.name)],
        policies=[make.cluster_policy(driver={"enabled": False})],
    )

    assert inv.driver.owner == "host"
    assert "ClusterPolicy cluster-policy spec.driver.enabled=false" in inv.driver.evidence
    assert (
        "GFD reports driver 570.172.08 but no operator driver pod runs here" in inv.driver.evidence
    )


def test_a_node_opted_out_of_the_operator_driver_with_a_working_driver_is_a_host_driver(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "false"})

    inv = make.assess(node, [make.device_plugin_pod(node.name)])

    assert inv.driver.owner == "host"
    assert "label nvidia.com/gpu.deploy.driver=false" in inv.driver.evidence


def test_a_crash_looping_operator_driver_pod_on_a_pre_installed_node_is_a_conflict(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    driver = make.driver_pod(
        node.name, phase="Running", ready=False, restarts=12, waiting_reason="CrashLoopBackOff",
        last_terminated_reason="Error",
    )

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "conflict"
    assert any("two driver sources" in e for e in inv.driver.evidence)
    assert any("CrashLoopBackOff (12 restarts)" in e for e in inv.driver.evidence)


def test_a_driver_manager_init_error_on_a_pre_installed_node_is_a_conflict(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    driver = make.driver_pod(
        node.name,
        phase="Pending",
        ready=False,
        init_containers=[make.init_container(last_terminated_reason="Error", restarts=1)],
    )

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "conflict"
    assert inv.driver_pod.text.startswith("Init:Error")


def test_a_host_driver_loaded_beside_a_failing_operator_driver_pod_is_a_conflict(make):
    # The driver manager missed the host driver (deploy.driver stayed "true"): GFD sees the
    # host's 570 loaded while the operator's 580 pod crash-loops.
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": "570.172.08"})
    driver = make.driver_pod(
        node.name, version="580.95.05", phase="Running", ready=False, restarts=12,
        waiting_reason="CrashLoopBackOff", last_terminated_reason="Error",
    )

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "conflict"
    assert any("driver 570.172.08 is loaded" in e and "(580.95.05)" in e for e in inv.driver.evidence)


def test_a_failing_operator_driver_pod_with_no_other_driver_stays_the_operators(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    driver = make.driver_pod(
        node.name, phase="Running", ready=False, restarts=12,
        waiting_reason="CrashLoopBackOff", last_terminated_reason="Error",
    )

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "operator"


def test_a_stale_pre_installed_label_with_a_ready_operator_driver_pod_is_owned_by_the_operator(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})

    inv = make.assess(node)

    assert inv.driver.owner == "operator"
    assert any("is stale" in e for e in inv.driver.evidence)


def test_a_gpu_node_with_no_driver_pod_no_host_label_and_no_gfd_version_has_no_driver(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})

    inv = make.assess(node, [])

    assert inv.driver.owner == "none"
    assert inv.driver.evidence[-1] == (
        "no driver pod, no pre-installed label and no driver version from GFD"
    )


def test_a_pending_driver_pod_with_nothing_else_to_go_on_is_unknown_and_says_why(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    driver = make.driver_pod(node.name, phase="Pending", ready=False)

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "unknown"
    assert "nothing shows a driver is loaded" in inv.driver.evidence[-1]


def test_a_driver_pod_creating_its_containers_is_owned_by_the_operator(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    driver = make.driver_pod(
        node.name, phase="Pending", ready=False, waiting_reason="ContainerCreating"
    )

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "operator"
    assert inv.driver_pod.text == "Pending (ContainerCreating)"


def test_a_starting_driver_pod_on_a_pre_installed_node_is_unknown_until_it_settles(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    driver = make.driver_pod(node.name, phase="Running", ready=False)

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "unknown"
    assert "either become Ready (stale label) or fail (conflict)" in inv.driver.evidence[-1]


def test_a_driver_pod_deleted_by_the_upgrade_controller_still_leaves_the_operator_as_owner(make):
    node = make.node(labels={"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"})

    inv = make.assess(node, [make.device_plugin_pod(node.name)])

    assert inv.driver.owner == "operator"
    assert "the upgrade controller is replacing the operator's driver pod" in inv.driver.evidence


def test_a_working_driver_with_no_driver_pod_and_no_host_marker_is_unknown(make):
    node = make.node()

    inv = make.assess(node, [make.device_plugin_pod(node.name)])

    assert inv.driver.owner == "unknown"
    assert "GFD reports driver 580.95.05 but no operator driver pod runs here" in evidence_text(inv)


def test_driver_pods_outside_the_operator_namespace_are_not_operator_driver_pods(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    foreign = make.driver_pod(node.name, namespace="someone-else")

    inv = make.assess(node, [foreign])

    assert inv.driver_pod.present is False
    assert inv.driver.owner == "none"


def test_a_driver_pod_not_run_by_a_daemonset_does_not_make_the_operator_the_owner(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    bare = make.driver_pod(node.name, owner_kind=None, name="hand-made-driver")

    inv = make.assess(node, [bare])

    assert inv.driver.owner == "unknown"
    assert "driver pod gpu-operator/hand-made-driver is not run by a DaemonSet (no controller)" in (
        inv.driver.evidence
    )


def test_without_a_gpu_operator_a_working_driver_belongs_to_the_host(make):
    node = make.node()

    inv = make.assess(node, [], operator=False, crds=False)

    assert inv.driver.owner == "host"
    assert any("no GPU Operator runs in this cluster" in e for e in inv.driver.evidence)


def test_the_newest_live_driver_pod_describes_the_node_during_a_rollout(make):
    node = make.node()
    old = make.driver_pod(
        node.name, version="570.172.08", deleting=True, created_at=make.now - dt.timedelta(days=9)
    )
    new = make.driver_pod(node.name, version="580.95.05", created_at=make.now - dt.timedelta(minutes=5))

    inv = make.assess(node, [old, new])

    assert inv.driver_pod.version == "580.95.05"
    assert inv.driver.owner == "operator"


def test_the_nvidia_driver_named_on_the_node_manages_its_driver(make):
    node = make.node(labels={H100_CR_LABEL: "h100-driver"})
    policy = make.cluster_policy(driver={"enabled": True, "useNvidiaDriverCRD": True})

    inv = make.assess(
        node,
        policies=[policy],
        nvidia_drivers=[make.nvidia_driver("h100-driver", node_selector={"gpuops.io/pool": "train-a"})],
    )

    assert inv.driver.owner == "operator"
    assert inv.driver.nvidia_driver == "h100-driver"
    assert (
        "label nvidia.com/gpu-operator.driver.owner=h100-driver "
        "(NVIDIADriver h100-driver manages this node)"
    ) in inv.driver.evidence


def test_a_node_without_the_owner_label_is_matched_to_an_nvidia_driver_by_node_selector(make):
    serving = make.node("gpu-a", pool="serving-a")
    training = make.node("gpu-b", pool="train-a")
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})

    fleet = make.fleet(
        [serving, training],
        make.operands("gpu-a") + make.operands("gpu-b"),
        policies=[policy],
        nvidia_drivers=[
            make.nvidia_driver("serving-driver", node_selector={"gpuops.io/pool": "serving-a"}),
            make.nvidia_driver("fallback", default=True),
        ],
    )

    assert fleet.nodes[NodeName("gpu-a")].driver.nvidia_driver == "serving-driver"
    assert (
        "NVIDIADriver serving-driver selects this node (nodeSelector gpuops.io/pool=serving-a)"
        in fleet.nodes[NodeName("gpu-a")].driver.evidence
    )
    assert fleet.nodes[NodeName("gpu-b")].driver.nvidia_driver == "fallback"


def test_a_node_no_nvidia_driver_selects_says_so_in_its_evidence(make):
    node = make.node(labels={"nvidia.com/cuda.driver-version.full": None})
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})

    inv = make.assess(
        node,
        [],
        policies=[policy],
        nvidia_drivers=[make.nvidia_driver("other", node_selector={"gpuops.io/pool": "other"})],
    )

    assert inv.driver.nvidia_driver is None
    assert "ClusterPolicy uses NVIDIADriver CRs but none selects this node" in inv.driver.evidence



def test_a_stalled_driver_pod_on_a_pre_installed_node_is_unknown_and_names_both_sources(make):
    node = make.node(labels={"nvidia.com/gpu.deploy.driver": "pre-installed"})
    driver = make.driver_pod(node.name, name="nvidia-driver-daemonset-q", phase="Pending", ready=False)

    inv = make.assess(node, [driver])

    assert inv.driver.owner == "unknown"
    assert inv.driver.evidence[-1] == (
        "driver pod gpu-operator/nvidia-driver-daemonset-q is Pending on a node marked "
        "pre-installed: cannot tell whether the host or the operator will provide the driver"
    )
