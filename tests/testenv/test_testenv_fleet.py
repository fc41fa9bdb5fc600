"""The fleet model of the test environment: hardware labels, the real operator's part
left to it, MIG devices from the operator's own mig-parted config, and the kwok stages
leaving the simulated operand pods to the simulator."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from testenv import fleet as fl
from testenv.controlplane import _STAGES

POOL = fl.PoolSpec(name="p", nodes=1)
MIG_POOL = fl.PoolSpec(name="m", nodes=1, product="NVIDIA-A100-SXM4-80GB", mig_config="all-1g.10gb")


def test_a_real_operator_fleet_declares_hardware_and_leaves_the_operators_labels_to_it():
    spec = fl.FleetSpec(name="f", pools=(POOL, MIG_POOL),
                        special_nodes=(fl.SpecialNode(node="p-01", driver_deploy="false"),))
    plain = fl.node_object(spec, POOL, "p-01")["metadata"]["labels"]
    mig = fl.node_object(spec, MIG_POOL, "m-01")["metadata"]["labels"]
    assert plain["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert (plain["nvidia.com/gpu.product"], plain["nvidia.com/gpu.count"]) == ("NVIDIA-H100-80GB-HBM3", "8")
    assert "nvidia.com/gpu.present" not in plain
    # Only the admin's opt-out; every other deploy label is the operator's to set.
    assert {k: v for k, v in plain.items() if k.startswith("nvidia.com/gpu.deploy.")} == {
        "nvidia.com/gpu.deploy.driver": "false"}
    assert (mig["nvidia.com/mig.capable"], mig["nvidia.com/mig.config"]) == ("true", "all-1g.10gb")


def test_a_stand_in_fleet_says_why_and_carries_the_operators_labels_itself():
    with pytest.raises(ValidationError, match="say why in operator.stand_in"):
        fl.OperatorSpec(driver_follows_deploy_label=False)
    spec = fl.FleetSpec(name="f", pools=(POOL,), operator=fl.OperatorSpec(stand_in="because"))
    assert not spec.operator.real
    labels = fl.node_object(spec, POOL, "p-01")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.present"] == labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert labels["nvidia.com/gpu.deploy.mig-manager"] == "false"


@pytest.mark.parametrize(("layout", "product", "devices"), [
    ("all-1g.10gb", "NVIDIA-A100-SXM4-80GB", {"1g.10gb": 56}),
    ("all-3g.40gb", "NVIDIA-H100-80GB-HBM3", {"3g.40gb": 16}),
    ("all-balanced", "NVIDIA-A100-SXM4-80GB", {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8}),
    ("all-disabled", "NVIDIA-A100-SXM4-80GB", {}),
])
def test_mig_devices_come_from_the_operators_own_mig_parted_config(layout, product, devices):
    assert fl.mig_devices(layout, product=product, gpus=8) == devices


def test_mig_parted_fails_a_layout_the_gpus_cannot_make_or_the_config_does_not_have():
    with pytest.raises(fl.MigLayoutError, match="cannot make 1g.18gb"):
        fl.mig_devices("all-1g.18gb", product="NVIDIA-A100-SXM4-80GB", gpus=8)
    with pytest.raises(fl.MigLayoutError, match="no MIG layout 'all-9g.99gb'"):
        fl.mig_devices("all-9g.99gb", product="NVIDIA-A100-SXM4-80GB", gpus=8)
    # all-1g.10gb names its GPUs by PCI id: an H200 has no entry in it, an A100-40GB its own.
    with pytest.raises(fl.MigLayoutError, match="no entry for GPU 0 of NVIDIA-H200"):
        fl.mig_devices("all-1g.10gb", product="NVIDIA-H200", gpus=8)
    assert fl.mig_devices("all-1g.10gb", product="NVIDIA-A100-SXM4-40GB", gpus=8) == {"1g.10gb": 32}


def test_a_custom_mig_parted_config_is_read_as_given():
    configs = fl.mig_parted_configs(yaml.safe_dump({"version": "v1", "mig-configs": {"half": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [2, 3], "mig-enabled": False}]}}))
    assert fl.mig_devices("half", product="NVIDIA-H100-80GB-HBM3", gpus=4, configs=configs) == {"3g.40gb": 4}


def test_kwok_leaves_exactly_the_simulated_operand_pods_to_the_simulator():
    stages = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(_STAGES.read_text())}
    expressions = {e["key"]: e for e in stages["pod-ready"]["spec"]["selector"]["matchExpressions"]}
    skipped_apps = set(expressions['.metadata.labels["app"]']["values"])
    skipped_components = set(expressions['.metadata.labels["app.kubernetes.io/component"]']["values"])
    assert skipped_apps == set(fl.SIMULATED_APPS)
    assert skipped_components == {fl.DRIVER_COMPONENT}
    assert fl.operand_of({"app": "nvidia-gpu-driver-ubuntu22.04-1a2b", "app.kubernetes.io/component": "nvidia-driver"}) \
        == "driver"
    assert fl.operand_of({"app": "gpu-feature-discovery"}) is None


def test_a_nodes_host_is_what_its_kubelet_reports_with_the_node_over_its_pool():
    pool = fl.PoolSpec(name="p", nodes=2, container_runtime="containerd://1.7.20", kernel="5.15.0-125-generic",
                       kubelet_version="v1.33.4")
    spec = fl.FleetSpec(name="f", pools=(pool,), special_nodes=(
        fl.SpecialNode(node="p-02", container_runtime="cri-o://1.30.4", kernel="5.15.0-130-generic",
                       nfd_kernel="5.15.0-125-generic"),))
    first, second = (fl.node_object(spec, pool, name) for name in ("p-01", "p-02"))
    assert first["status"]["nodeInfo"] == {"containerRuntimeVersion": "containerd://1.7.20",
                                           "kernelVersion": "5.15.0-125-generic", "kubeletVersion": "v1.33.4"}
    assert second["status"]["nodeInfo"] == {"containerRuntimeVersion": "cri-o://1.30.4",
                                            "kernelVersion": "5.15.0-130-generic", "kubeletVersion": "v1.33.4"}
    # NFD's label lags the kernel the kubelet reports only where the node says so.
    assert first["metadata"]["labels"]["feature.node.kubernetes.io/kernel-version.full"] == "5.15.0-125-generic"
    assert second["metadata"]["labels"]["feature.node.kubernetes.io/kernel-version.full"] == "5.15.0-125-generic"
    # A pool that declares no host reports none, as before.
    assert "nodeInfo" not in fl.node_object(fl.FleetSpec(name="f", pools=(POOL,)), POOL, "p-01")["status"]


def test_a_precompiled_fleet_asks_the_operator_for_its_drivers_branch():
    spec = fl.FleetSpec(name="f", pools=(POOL,), operator=fl.OperatorSpec(use_precompiled=True,
                                                                           driver_version="580.95.05"))
    driver = fl.cluster_policy_object(spec)["spec"]["driver"]
    assert (driver["usePrecompiled"], driver["version"]) == (True, "580")
    assert "usePrecompiled" not in fl.cluster_policy_object(fl.FleetSpec(name="f", pools=(POOL,)))["spec"]["driver"]
    with pytest.raises(ValidationError, match="use_precompiled needs the real operator"):
        fl.OperatorSpec(use_precompiled=True, stand_in="because")
