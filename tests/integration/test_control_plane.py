"""The local control plane is a real one: admission, CRD schemas, RBAC, eviction and
PodDisruptionBudgets behave as on a cluster."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from testenv import build
from testenv import fleet as fl
from testenv.controlplane import ControlPlane, ControlPlaneError
from testenv.install import Installer, wait_until


TINY = fl.FleetSpec(
    name="tiny",
    system_nodes=0,
    pools=(fl.PoolSpec(name="pool-a", kind="serving", nodes=2),),
)


def _evict(installer: Installer, namespace: str, name: str) -> None:
    installer.call(
        "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
        body={"apiVersion": "policy/v1", "kind": "Eviction",
              "metadata": {"name": name, "namespace": namespace}},
    )


def _running_pod(installer: Installer, *, namespace: str, name: str, node: str, labels: dict) -> dict:
    installer.create({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": name, "namespace": namespace, "labels": labels},
                      "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                               "containers": [{"name": "main", "image": "registry.example/app:1"}]}})
    pod = {"kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
    wait_until(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                           for c in installer.get(pod).get("status", {}).get("conditions", [])),
               timeout=30, what=f"kwok to make pod {name} Running and Ready")
    return pod


def test_evicting_a_pod_whose_pdb_allows_no_disruption_is_refused_with_429(cluster, fleet):
    fleet(TINY, simulate=False, advertise=True)
    installer = cluster.installer()
    installer.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": "pdb-test", "labels": {fl.FLEET_LABEL: "tiny"}}})
    pod = _running_pod(installer, namespace="pdb-test", name="replica-0", node="pool-a-01",
                       labels={"app": "replica"})
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "replica", "namespace": "pdb-test"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "replica"}}}}
    installer.create(pdb)
    wait_until(lambda: installer.get(pdb).get("status", {}).get("observedGeneration") == 1,
               timeout=30, what="the disruption controller to observe the PDB")

    with pytest.raises(ApiException) as refused:
        _evict(installer, "pdb-test", "replica-0")
    assert refused.value.status == 429
    assert "disruption budget" in refused.value.body
    assert installer.get(pod)["metadata"].get("deletionTimestamp") is None

    # With the budget relaxed the same eviction goes through and kwok removes the pod.
    installer.call("PATCH", "/apis/policy/v1/namespaces/pdb-test/poddisruptionbudgets/replica",
                   body={"spec": {"minAvailable": 0}}, content_type="application/merge-patch+json")
    wait_until(lambda: installer.get(pdb)["status"].get("disruptionsAllowed") == 1,
               timeout=30, what="the PDB to allow a disruption")
    _evict(installer, "pdb-test", "replica-0")

    def gone() -> bool:
        try:
            installer.get(pod)
        except ApiException as err:
            return err.status == 404
        return False

    wait_until(gone, timeout=30, what="the evicted pod to be deleted")


def test_a_cluster_policy_with_an_invalid_field_is_rejected_by_the_crd_schema(gpu_operator_crds):
    installer = gpu_operator_crds.installer()
    policy = fl.cluster_policy_object(TINY)
    policy["metadata"]["name"] = "invalid-policy"
    policy["spec"]["driver"]["enabled"] = "sometimes"
    with pytest.raises(ApiException) as rejected:
        installer.create(policy)
    assert rejected.value.status == 422
    assert "spec.driver.enabled" in rejected.value.body

    valid = fl.cluster_policy_object(TINY)
    valid["metadata"]["name"] = "valid-policy"
    created = installer.create(valid)
    assert created["spec"]["driver"]["version"] == TINY.operator.driver_version
    installer.delete(valid)


def test_the_bots_token_is_denied_by_rbac_until_a_role_allows_it(cluster):
    admin = cluster.installer()
    bot = Installer(cluster.api_client("bot"))
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rbac-test"}}, exist_ok=True)

    with pytest.raises(ApiException) as denied:
        bot.list("Pod", namespace="rbac-test")
    assert denied.value.status == 403
    assert "system:serviceaccount:gpuops:gpuops" in denied.value.body

    admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": "pod-reader", "namespace": "rbac-test"},
                  "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": "gpuops-pod-reader", "namespace": "rbac-test"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                  "subjects": [{"kind": "ServiceAccount", "name": "gpuops", "namespace": "gpuops"}]})

    def allowed() -> bool:
        try:
            return bot.list("Pod", namespace="rbac-test") == []
        except ApiException as err:
            assert err.status == 403
            return False

    wait_until(allowed, timeout=30, what="the RoleBinding to take effect")
    # The Role grants only what it names: deleting is still refused, and so is another namespace.
    with pytest.raises(ApiException) as still_denied:
        bot.list("Pod", namespace="default")
    assert still_denied.value.status == 403
    # Humans have identities of their own, with no rights by default.
    with pytest.raises(ApiException) as alice:
        Installer(cluster.api_client("alice")).list("Node")
    assert alice.value.status == 403
    admin.delete({"kind": "Namespace", "metadata": {"name": "rbac-test"}})


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_stopping_the_control_plane_leaves_no_process_or_port_behind(tmp_path):
    plane = ControlPlane(bin_dir=build.ensure_binaries(), folder=tmp_path / "plane")
    plane.start()
    pids = plane.pids
    port = int(plane.server.rsplit(":", 1)[1])
    assert len(pids) == 5 and _port_open(port)
    plane.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not _port_open(port)


def test_a_component_that_does_not_come_up_fails_the_start_naming_its_log(tmp_path):
    real = build.ensure_binaries()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name in build.BINARIES:
        (fake_bin / name).symlink_to(real / name)
    broken = fake_bin / "kube-apiserver"
    broken.unlink()
    broken.write_text("#!/bin/sh\necho 'error: cannot start: simulated failure' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)

    plane = ControlPlane(bin_dir=fake_bin, folder=tmp_path / "plane")
    with pytest.raises(ControlPlaneError) as failed:
        plane.start(timeout=30)
    message = str(failed.value)
    assert "kube-apiserver exited with code 3" in message
    assert str(tmp_path / "plane" / "logs" / "kube-apiserver.log") in message
    assert "simulated failure" in message
    # etcd, started before it, was stopped again.
    assert plane.pids == []


def test_missing_gpu_operator_crds_fail_with_where_to_get_them(monkeypatch, tmp_path):
    from testenv.install import CrdsMissing, crds_folder

    monkeypatch.setenv("GPUOPS_GPU_OPERATOR_CRDS", str(tmp_path))
    with pytest.raises(CrdsMissing) as missing:
        crds_folder()
    assert "nvidia.com_clusterpolicies.yaml" in str(missing.value)
    assert "crds/" in str(missing.value)
    monkeypatch.delenv("GPUOPS_GPU_OPERATOR_CRDS")
    with pytest.raises(CrdsMissing, match="is not set"):
        crds_folder()


def test_the_kubeconfig_is_private_and_names_every_identity(cluster):
    kubeconfig = Path(cluster.kubeconfig)
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    text = kubeconfig.read_text()
    for context in ("admin", "bot", "alice", "bob"):
        assert f"name: {context}" in text
    assert "127.0.0.1" in cluster.plane.server


def test_a_pod_on_a_node_nothing_runs_is_removed_at_once_by_a_delete_with_no_grace(cluster):
    """What a fleet's removal relies on when a ReplicaSet put a pod on a node just before the
    node went: no kubelet will ever finish a graceful delete there."""
    installer = cluster.installer()
    installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "orphans"}}, exist_ok=True)
    pod = installer.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranded", "namespace": "orphans"},
                            "spec": {"nodeName": "no-such-node", "terminationGracePeriodSeconds": 30,
                                     "containers": [{"name": "main", "image": "registry.example/x:1"}]}})
    try:
        installer.delete(pod)
        assert installer.get(pod)["metadata"].get("deletionTimestamp")  # waits for a kubelet that never comes
        installer.delete(pod, grace=0)
        with pytest.raises(ApiException) as gone:
            installer.get(pod)
        assert gone.value.status == 404
    finally:
        installer.delete({"kind": "Namespace", "metadata": {"name": "orphans"}})
