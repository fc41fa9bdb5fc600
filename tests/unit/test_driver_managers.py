"""Which object sets the driver version of a pool, and which other pools it reaches: the
question every driver upgrade starts with (a ClusterPolicy treats all its pools as one)."""

from __future__ import annotations

from commands import messages as msg


def _operands(make, node: str, **driver) -> list:
    return [make.driver_pod(node, **driver), make.device_plugin_pod(node), make.validator_pod(node)]


def test_a_cluster_policy_drives_every_pool_it_deploys_the_driver_to_and_says_so(make):
    nodes = [make.node("s1", pool="serving-a"), make.node("t1", pool="training-a"),
             make.node("h1", pool="hosts", labels={"nvidia.com/gpu.deploy.driver": "pre-installed",
                                                   "nvidia.com/cuda.driver-version.full": "570.172.08"})]
    pods = _operands(make, "s1") + _operands(make, "t1") + [make.device_plugin_pod("h1"), make.validator_pod("h1")]
    policy = make.cluster_policy(driver={"enabled": True, "version": "580.95.05",
                                         "upgradePolicy": {"autoUpgrade": False}})

    fleet = make.fleet(nodes, pods, policies=[policy])

    serving = fleet.pool("serving-a")
    (manager,) = serving.driver_managers
    assert (manager.ref, manager.version, manager.pools) == (
        "ClusterPolicy cluster-policy", "580.95.05", ("serving-a", "training-a"))
    assert serving.shares_driver_with() == ("training-a",)
    assert msg.driver_managers(serving) == (
        "ClusterPolicy cluster-policy (580.95.05), shared with training-a: a version change there reaches that "
        "pool too, on each driver pod's next restart (autoUpgrade off)")
    # Host drivers only: no operator object sets this pool's version.
    assert fleet.pool("hosts").driver_managers == ()
    assert msg.driver_managers(fleet.pool("hosts")).startswith("nothing in the GPU Operator")


def test_an_nvidia_driver_per_pool_drives_that_pool_only(make):
    nodes = [make.node("s1", pool="serving-a"), make.node("t1", pool="training-a")]
    pods = _operands(make, "s1") + _operands(make, "t1", version="570.172.08")
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})
    drivers = [make.nvidia_driver("serving-driver", node_selector={"gpuops.io/pool": "serving-a"}, auto_upgrade=True),
               make.nvidia_driver("training-driver", node_selector={"gpuops.io/pool": "training-a"},
                                  version="570.172.08", auto_upgrade=False)]

    fleet = make.fleet(nodes, pods, policies=[policy], nvidia_drivers=drivers)

    (serving,) = fleet.pool("serving-a").driver_managers
    assert (serving.ref, serving.version, serving.pools, serving.auto_upgrade.state) == (
        "NVIDIADriver serving-driver", "580.95.05", ("serving-a",), "on")
    assert msg.driver_managers(fleet.pool("training-a")) == "NVIDIADriver training-driver (570.172.08), for this pool only"


def test_one_nvidia_driver_selecting_two_pools_is_shared_and_the_operator_rolls_it_out_there_itself(make):
    nodes = [make.node("s1", pool="serving-a"), make.node("t1", pool="training-a")]
    pods = _operands(make, "s1") + _operands(make, "t1")
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})
    drivers = [make.nvidia_driver("everything", default=True, auto_upgrade=True)]

    pool = make.fleet(nodes, pods, policies=[policy], nvidia_drivers=drivers).pool("training-a")

    assert pool.shares_driver_with() == ("serving-a",)
    assert msg.driver_managers(pool).endswith(
        "shared with serving-a: a version change there reaches that pool too, the operator rolls it out there "
        "itself (autoUpgrade on)")
