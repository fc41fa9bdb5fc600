"""The dcgm-exporter pods found through the real API and the watch cache: each node's pod
and the IP the API reports for it reach the exporter reader, which asks that address (kwok
gives the pods addresses nothing answers on, so each node's health is unknown, with the
pod and its address in the reason, never healthy). Reading a page that answers is the
end-to-end test's part (tests/e2e/test_dcgm_health_exporters.py)."""

from __future__ import annotations

import datetime as dt

from testenv import fleet as fl
from testenv.install import wait_until
from workflows.config import GpuopsConfig
from workflows.signals.exporters import exporter_pods


EXPORTERS = fl.FleetSpec(name="exporters", system_nodes=0, pools=(fl.PoolSpec(name="train", nodes=2),))
NODES = ("train-01", "train-02")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def test_each_nodes_exporter_pod_and_its_ip_come_from_the_api_and_an_unreachable_one_is_unknown(fleet, fleet_cache):
    fleet(EXPORTERS)
    cache = fleet_cache()

    def found() -> dict:
        snapshot = cache.snapshot(_now())
        if snapshot.operator_namespace is None:
            return {}
        pods = exporter_pods(snapshot, namespace=snapshot.operator_namespace, labels={"app": "nvidia-dcgm-exporter"})
        return {node: pod for node, pod in pods.items() if pod.ip is not None and pod.phase == "Running"}

    wait_until(lambda: sorted(found()) == list(NODES), timeout=60, what="a running dcgm-exporter pod on each node")
    pods = found()
    namespace = cache.snapshot(_now()).operator_namespace
    config = GpuopsConfig.model_validate({"signals": {"exporters": {"timeout": "1s"}}})
    signals = config.signals.service(cluster=cache)  # type: ignore[union-attr]
    reading = signals.read()
    assert reading.unavailable is None and reading.nodes == {}
    assert sorted(reading.unknown) == list(NODES) and reading.failed == set(NODES)
    for node, pod in pods.items():
        assert reading.unknown[node].startswith(f"on {node}: {namespace}/{pod.name} at {pod.ip}:9400 "), \
            reading.unknown[node]
    one = signals.read(NODES[0])
    assert one.nodes == {} and one.unavailable is not None and f"at {pods[NODES[0]].ip}:9400" in one.unavailable
