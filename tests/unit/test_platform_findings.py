"""Findings about the platform under the operator (issue 22): the operator's release
against the cluster's Kubernetes, the nodes' container runtime against the toolkit's, the
nodes' kernel against a precompiled driver, and a device plugin that looks healthy on a
node whose last canary pod failed. Each fires with its evidence, and its near miss stays
quiet."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import msgspec
import pytest

from commands.catalog import dispatch
from commands.services import Services
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import open_database
from storage.ids import RequestId
from fleet_builder import NOW
from workflows.config import GpuopsConfig
from workflows.fleet.assessment import assess_node
from workflows.fleet.operator_settings import fleet_context
from workflows.fleet.pods import group_pods_by_node
from workflows.fleet.settings import InventorySettings
from workflows.fleet.canaries import CanaryVerdict, LastCanaries
from workflows.fleet.platform import KubernetesRange, release_line, runtime_of, shipped_operator_support
from workflows.fleet.summary import build_fleet, summarize
from workflows.kube.gateway.decoding import node_from_json
from workflows.kube.objects import NodeInfo, NodeName, ToolkitTemplate
from workflows.kube.wire import DaemonSetWire, toolkit_template_view

KERNEL = "5.15.0-1045-nvidia"


def only(findings, code):
    (finding,) = [f for f in findings if f.code == code]
    return finding


def none_of(findings, code) -> bool:
    return all(f.code != code for f in findings)


def hosted(node, **info):
    """`node` with what its kubelet reports of the host."""
    defaults = {"kubelet_version": "v1.33.4", "container_runtime_version": "containerd://1.7.27",
                "kernel_version": KERNEL, "os_image": "Ubuntu 22.04.5 LTS"}
    return dataclasses.replace(node, info=NodeInfo(**{**defaults, **info}))


# ------------------------------------------------------------------ the node's host as read


def test_the_kubelets_report_of_its_host_is_read_from_the_node():
    node = node_from_json({"metadata": {"name": "gpu-1"}, "status": {"nodeInfo": {
        "kubeletVersion": "v1.33.4", "containerRuntimeVersion": "cri-o://1.33.2",
        "kernelVersion": "6.8.0-1017-aws", "osImage": "Ubuntu 24.04.2 LTS", "machineID": "x"}}})

    assert node.info == NodeInfo(kubelet_version="v1.33.4", container_runtime_version="cri-o://1.33.2",
                                 kernel_version="6.8.0-1017-aws", os_image="Ubuntu 24.04.2 LTS")
    assert node_from_json({"metadata": {"name": "gpu-2"}}).info == NodeInfo()


def test_the_toolkit_daemonset_says_which_runtime_the_operator_configured():
    wire = msgspec.convert({"metadata": {"name": "nvidia-container-toolkit-daemonset", "namespace": "gpu-operator"},
                            "spec": {"template": {"spec": {"containers": [{
                                "name": "nvidia-container-toolkit-ctr", "image": "toolkit:v1.18.0",
                                "env": [{"name": "RUNTIME", "value": "containerd"},
                                        {"name": "CONTAINERD_RUNTIME_CLASS", "value": "nvidia"},
                                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}]}}}},
                           DaemonSetWire)

    assert toolkit_template_view(wire) == ToolkitTemplate(
        namespace="gpu-operator", name="nvidia-container-toolkit-daemonset", runtime="containerd",
        runtime_class="nvidia")


def test_runtimes_are_read_as_the_operator_reads_them():
    assert runtime_of("containerd://1.7.27") == "containerd"
    assert runtime_of("cri-o://1.33.2") == "crio"
    assert runtime_of("docker://28.0.1") == "docker"
    assert runtime_of("remote://1.0") == "remote"
    assert runtime_of("") is None


# ------------------------------------------------------------------ operator vs Kubernetes


def test_the_shipped_support_table_loads_and_names_its_source_for_every_release_line():
    table = shipped_operator_support()

    assert {"25.10", "26.7"} <= set(table)
    assert table["25.10"] == KubernetesRange(low=(1, 30), high=(1, 35), source=table["25.10"].source)
    assert all("cloud-native-docs" in row.source for row in table.values())
    assert release_line("v25.10.1") == "25.10"


def test_an_api_server_newer_than_the_operator_release_supports_is_a_warning_with_both_versions_and_the_range(make):
    node = hosted(make.node("gpu-1"), kubelet_version="v1.37.2")

    fleet = _with_api(make, [node], "v1.37.2", operator_version="v25.10.1")

    finding = only(fleet.findings, "kubernetes-unsupported")
    assert finding.severity == "warning" and finding.subject == "cluster"
    assert "GPU Operator v25.10.1 (release 25.10) is supported on Kubernetes 1.30-1.35" in finding.message
    assert "the API server runs 1.37" in finding.message and "gpu-1's kubelet runs 1.37" in finding.message


def test_kubelets_left_behind_outside_the_range_are_named_even_when_the_api_server_is_supported(make):
    nodes = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), kubelet_version="v1.29.9")]

    fleet = _with_api(make, nodes, "v1.33.1", operator_version="v26.7.0")

    finding = only(fleet.findings, "kubernetes-unsupported")
    assert "gpu-2's kubelet runs 1.29" in finding.message
    assert "API server" not in finding.message


def test_a_supported_pair_says_nothing(make):
    nodes = [hosted(make.node("gpu-1"), kubelet_version="v1.34.2")]

    fleet = _with_api(make, nodes, "v1.34.2+k3s1", operator_version="v26.7.0")

    assert none_of(fleet.findings, "kubernetes-unsupported") and none_of(fleet.findings, "kubernetes-support-unknown")


def test_a_release_missing_from_the_table_is_unknown_not_silently_supported(make):
    nodes = [hosted(make.node("gpu-1"))]

    fleet = _with_api(make, nodes, "v1.33.1", operator_version="v27.1.0")

    finding = only(fleet.findings, "kubernetes-support-unknown")
    assert finding.severity == "info"
    assert "v27.1.0 (release 27.1) is not in gpuops' support table" in finding.message
    assert "inventory.operator_support" in finding.message


def test_the_configuration_extends_the_table_with_a_release_line(make):
    config = GpuopsConfig.model_validate({"inventory": {"operator_support": {"27.1": {"kubernetes": "1.33-1.37"}}}})
    nodes = [hosted(make.node("gpu-1"))]

    fleet = _with_api(make, nodes, "v1.37.0", operator_version="v27.1.0", settings=config.inventory_settings())

    assert none_of(fleet.findings, "kubernetes-support-unknown") and none_of(fleet.findings, "kubernetes-unsupported")


def test_a_bad_support_row_in_the_configuration_is_refused_with_the_key():
    with pytest.raises(ValueError, match="operator_support"):
        GpuopsConfig.model_validate({"inventory": {"operator_support": {"27.1": {"kubernetes": "latest"}}}})


# ------------------------------------------------------------------ runtime vs toolkit


TOOLKIT = ToolkitTemplate(namespace="gpu-operator", name="nvidia-container-toolkit-daemonset", runtime="containerd")


def test_pool_nodes_on_another_runtime_than_the_toolkit_is_configured_for_are_a_warning_per_pool(make):
    nodes = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), container_runtime_version="cri-o://1.33.2")]

    fleet = _with_api(make, nodes, None, toolkit_templates=(TOOLKIT,))

    finding = only(fleet.findings, "runtime-mismatch")
    assert finding.severity == "warning" and finding.subject == "train-a"
    assert "1 of 2 nodes in pool train-a" in finding.message
    assert "cri-o://1.33.2 on gpu-2" in finding.message
    assert "RUNTIME=containerd on DaemonSet gpu-operator/nvidia-container-toolkit-daemonset" in finding.message


def test_before_the_toolkit_daemonset_is_seen_the_operators_own_choice_of_containerd_is_assumed(make):
    nodes = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), container_runtime_version="docker://28.0.1")]

    finding = only(_with_api(make, nodes, None).findings, "runtime-mismatch")

    assert "docker://28.0.1 on gpu-2" in finding.message
    assert "as the operator chooses" in finding.message


def test_nodes_on_the_toolkits_runtime_and_a_toolkit_the_operator_does_not_run_say_nothing(make):
    same = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), container_runtime_version="containerd://2.1.1")]
    mixed = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), container_runtime_version="cri-o://1.33.2")]
    no_toolkit = make.cluster_policy()
    no_toolkit = dataclasses.replace(no_toolkit, spec={**no_toolkit.spec, "toolkit": {"enabled": False}})

    assert none_of(_with_api(make, same, None, toolkit_templates=(TOOLKIT,)).findings, "runtime-mismatch")
    assert none_of(_with_api(make, mixed, None, policies=(no_toolkit,)).findings, "runtime-mismatch")


# ------------------------------------------------------------------ kernel vs precompiled driver


def precompiled_policy(make):
    return make.cluster_policy(driver={"enabled": True, "usePrecompiled": True, "version": "580"})


def precompiled_driver_pod(make, node: str, kernel: str = KERNEL, **kwargs):
    pod = make.driver_pod(node, **kwargs)
    image = f"nvcr.io/nvidia/driver:580-{kernel}-ubuntu22.04"
    return dataclasses.replace(pod, images=(image,))


def test_a_precompiled_driver_image_built_for_another_kernel_is_a_warning_naming_both(make):
    node = hosted(make.node("gpu-1"), kernel_version="5.15.0-1050-nvidia")
    pods = [precompiled_driver_pod(make, "gpu-1"), make.device_plugin_pod("gpu-1")]

    finding = only(_with_api(make, [node], None, pods=pods, policies=(precompiled_policy(make),)).findings,
                   "precompiled-kernel")

    assert finding.severity == "warning"
    assert "runs kernel 5.15.0-1050-nvidia" in finding.message and f"580-{KERNEL}-ubuntu22.04" in finding.message


def test_a_precompiled_image_for_the_nodes_kernel_that_cannot_be_pulled_is_critical(make):
    node = hosted(make.node("gpu-1"), kernel_version="6.8.0-1099-custom")
    pods = [precompiled_driver_pod(make, "gpu-1", kernel="6.8.0-1099-custom", phase="Pending", ready=False,
                                   waiting_reason="ImagePullBackOff")]

    finding = only(_with_api(make, [node], None, pods=pods, policies=(precompiled_policy(make),)).findings,
                   "precompiled-kernel")

    assert finding.severity == "critical"
    assert "no precompiled driver image for kernel 6.8.0-1099-custom on gpu-1" in finding.message
    assert "ImagePullBackOff" in finding.message


def test_a_precompiled_driver_for_the_nodes_kernel_or_a_driver_that_is_not_precompiled_says_nothing(make):
    node = hosted(make.node("gpu-1"))
    healthy = [precompiled_driver_pod(make, "gpu-1"), make.device_plugin_pod("gpu-1")]
    # Not precompiled: the tag carries no kernel, and none is expected.
    ordinary = make.operands("gpu-1")

    assert none_of(_with_api(make, [node], None, pods=healthy, policies=(precompiled_policy(make),)).findings,
                   "precompiled-kernel")
    assert none_of(_with_api(make, [node], None, pods=ordinary).findings, "precompiled-kernel")


def test_a_pool_on_several_kernels_under_precompiled_drivers_is_told_once(make):
    nodes = [hosted(make.node("gpu-1")), hosted(make.node("gpu-2"), kernel_version="5.15.0-1050-nvidia")]
    pods = [precompiled_driver_pod(make, "gpu-1"), precompiled_driver_pod(make, "gpu-2", kernel="5.15.0-1050-nvidia")]

    fleet = _with_api(make, nodes, None, pods=pods, policies=(precompiled_policy(make),))
    one_kernel = _with_api(make, nodes[:1], None, pods=pods[:1], policies=(precompiled_policy(make),))

    finding = only(fleet.findings, "precompiled-kernels-mixed")
    assert finding.severity == "info" and finding.subject == "train-a"
    assert f"{KERNEL} (1 node)" in finding.message and "5.15.0-1050-nvidia (1 node)" in finding.message
    assert none_of(one_kernel.findings, "precompiled-kernels-mixed")


# ------------------------------------------------------------------ device plugin Ready, canary failed


def failed_canary(node: str = "gpu-1", *, hours: float = 3) -> CanaryVerdict:
    return CanaryVerdict(node=NodeName(node), passed=False, at=NOW - dt.timedelta(hours=hours), run_id="run-7f3a",
                         pod="gpuops/gpuops-check-gpu-1-abc", exit_code=1, reason="Error",
                         message="Failed to initialize NVML: Driver/library version mismatch\n")


def test_a_ready_device_plugin_on_a_schedulable_node_whose_last_canary_failed_is_critical(make):
    fleet = _with_canaries(make, [make.node("gpu-1")], {NodeName("gpu-1"): failed_canary()})

    finding = only(fleet.findings, "canary-failed")
    assert finding.severity == "critical" and finding.subject == "gpu-1"
    assert "device plugin on gpu-1 is Ready and advertises 8 GPUs" in finding.message
    assert "failed 3h ago (run run-7f3a: exited 1 (Error)" in finding.message
    assert "Driver/library version mismatch" in finding.message and "cordon it" in finding.message


def test_the_same_on_a_cordoned_node_is_a_warning(make):
    fleet = _with_canaries(make, [make.node("gpu-1", unschedulable=True)], {NodeName("gpu-1"): failed_canary()})

    assert only(fleet.findings, "canary-failed").severity == "warning"


def test_a_passed_canary_or_a_device_plugin_that_is_not_ready_says_nothing(make):
    passed = dataclasses.replace(failed_canary(), passed=True, exit_code=0, reason=None, message=None)
    not_ready = [make.driver_pod("gpu-1"), make.device_plugin_pod("gpu-1", ready=False, waiting_reason=None)]

    assert none_of(_with_canaries(make, [make.node("gpu-1")], {NodeName("gpu-1"): passed}).findings,
                   "canary-failed")
    assert none_of(_with_canaries(make, [make.node("gpu-1")], {NodeName("gpu-1"): failed_canary()},
                                  pods=not_ready).findings, "canary-failed")


def test_the_last_verdict_per_node_comes_from_the_steps_a_pass_after_a_failure_wins(tmp_path: Path):
    db = open_database(tmp_path / "gpuops.db")
    failed = _check_step(db, "req-1", "gpu-1", at=NOW - dt.timedelta(hours=5), passed=False)
    _check_step(db, "req-2", "gpu-1", at=NOW - dt.timedelta(hours=1), passed=True)
    _check_step(db, "req-3", "gpu-2", at=NOW - dt.timedelta(hours=2), passed=False)
    # A dry run's "check" ran no pod, and a stopped step has no verdict: neither counts.
    _check_step(db, "req-4", "gpu-2", at=NOW - dt.timedelta(minutes=30), passed=True, dry_run=True)
    _check_step(db, "req-5", "gpu-2", at=NOW - dt.timedelta(minutes=20), passed=False, stopped=True)

    verdicts = LastCanaries(lambda: db).verdicts(NOW)

    assert verdicts[NodeName("gpu-1")].passed and verdicts[NodeName("gpu-1")].run_id != failed
    gpu2 = verdicts[NodeName("gpu-2")]
    assert not gpu2.passed and gpu2.exit_code == 1 and gpu2.message == "NVML: Driver/library version mismatch"
    assert gpu2.pod == "gpuops/gpuops-check-gpu-2" and gpu2.at == NOW - dt.timedelta(hours=2)
    db.close()


# ------------------------------------------------------------------ /gpu node shows the host


class StaticFleet:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now):
        return self.value


def test_gpu_node_shows_runtime_kernel_kubelet_and_the_last_check(make, tmp_path: Path):
    config = GpuopsConfig.model_validate({"pools": {"train-a": {"kind": "training", "windows": "always"}},
                                          "access": {"users": {"U0DAVE": ["viewer"]}}})
    fleet = _with_canaries(make, [hosted(make.node("gpu-1"))], {NodeName("gpu-1"): failed_canary()})
    services = Services.on_database(config=config, fleet=StaticFleet(fleet), database=open_database(tmp_path / "db"))

    reply = dispatch("node gpu-1", actor=config.actor("U0DAVE"), services=services, now=NOW)

    facts = {f.label: f.value for s in reply.sections for f in s.facts}
    assert facts["Container runtime"] == "containerd://1.7.27"
    assert facts["Kernel"] == f"{KERNEL} (Ubuntu 22.04.5 LTS)"
    assert facts["Kubelet"] == "v1.33.4"
    assert facts["Last GPU check"] == "failed 3h ago (run run-7f3a)"
    assert any(n.text.startswith("device plugin on gpu-1 is Ready") for s in reply.sections for n in s.notices)
    services.database.close()  # type: ignore[union-attr]


# ------------------------------------------------------------------ helpers


def _with_api(make, nodes, api_version, *, pods=None, settings=None, toolkit_templates=(), **snapshot_args):
    chosen = pods if pods is not None else [p for n in nodes for p in make.operands(n.name)]
    snapshot = dataclasses.replace(make.snapshot(nodes, chosen, **snapshot_args), kubernetes_version=api_version,
                                   toolkit_templates=tuple(toolkit_templates))
    return build_fleet(snapshot, settings=settings or InventorySettings(), now=NOW)


def _with_canaries(make, nodes, canaries, *, pods=None):
    settings = InventorySettings()
    chosen = pods if pods is not None else [p for n in nodes for p in make.operands(n.name)]
    snapshot = make.snapshot(nodes, chosen)
    context = fleet_context(snapshot, settings=settings)
    by_node = group_pods_by_node(snapshot.pods)
    assessed = {n.name: assess_node(n, pods_on_node=by_node.get(n.name, ()), context=context, settings=settings,
                                    now=NOW) for n in nodes}
    return summarize(assessed, context=context, settings=settings, now=NOW, canaries=canaries)


def test_with_several_clusters_each_reads_the_checks_of_its_own_runs(tmp_path: Path):
    """Two clusters may each have a node called gpu-1: a failed check in one is not the
    other's."""
    db = open_database(tmp_path / "gpuops.db")
    _check_step(db, "req-1", "gpu-1", at=NOW - dt.timedelta(hours=1), passed=False, cluster="east")
    _check_step(db, "req-2", "gpu-1", at=NOW - dt.timedelta(minutes=5), passed=True, cluster="west")

    east = LastCanaries(lambda: db, cluster="east").verdicts(NOW)
    west = LastCanaries(lambda: db, cluster="west").verdicts(NOW)

    assert not east[NodeName("gpu-1")].passed and west[NodeName("gpu-1")].passed
    assert LastCanaries(lambda: db, cluster="north").verdicts(NOW) == {}
    assert LastCanaries(lambda: db).verdicts(NOW)[NodeName("gpu-1")].passed  # one cluster: every run's
    db.close()


def _check_step(db, request: str, node: str, *, at: dt.datetime, passed: bool, dry_run: bool = False,
                stopped: bool = False, cluster: str | None = None) -> str:
    """A run with one gpu-check step on `node`, ended at `at` as the engine ends it."""
    stored_requests.create(db, id=RequestId(request), kind="upgrade", pool="train-a", cluster=cluster,
                           targets=[node], window_start=None, window_end=None, reason="r", requester="U0REQ",
                           requester_name="Ada", plan={}, plan_hash="h", approvals_required=0,
                           expires_at=at + dt.timedelta(days=1), at=at - dt.timedelta(hours=1))
    run = stored_runs.create(db, request_id=RequestId(request), dry_run=dry_run, at=at)
    assert run is not None
    (step,) = stored_steps.add(db, run_id=run.id, steps=[stored_steps.NewStep(wave=0, node=node, seq=0,
                                                                             kind="gpu-check")])
    stored_steps.transition(db, id=step.id, expected="pending", new="running", at=at - dt.timedelta(minutes=2))
    intent = {"pod": f"gpuops/gpuops-check-{node}"}
    if stopped:
        stored_steps.transition(db, id=step.id, expected="running", new="failed", at=at, error="the run was aborted")
    elif passed:
        stored_steps.transition(db, id=step.id, expected="running", new="done", at=at,
                                detail={"intent": intent, "note": "passed", "result": {}})
    else:
        stored_steps.transition(db, id=step.id, expected="running", new="failed", at=at,
                                detail={"intent": intent, "note": "failed", "result": {
                                    "exit_code": 1, "reason": "Error",
                                    "message": "NVML: Driver/library version mismatch"}},
                                error="the check pod failed")
    return str(run.id)


def test_a_precompiled_tag_names_the_driver_branch_and_a_failing_pod_of_that_branch_is_no_host_conflict(make):
    node = hosted(make.node("gpu-1"), kernel_version="6.8.0-1099-custom")
    pods = [precompiled_driver_pod(make, "gpu-1", kernel="6.8.0-1099-custom", phase="Pending", ready=False,
                                   waiting_reason="ImagePullBackOff")]

    fleet = _with_api(make, [node], None, pods=pods, policies=(precompiled_policy(make),))

    assert fleet.nodes[NodeName("gpu-1")].driver_pod.version == "580"
    assert none_of(fleet.findings, "driver-conflict")
