"""Crash safety of a driver upgrade on the real GPU Operator: the engine process is killed
with SIGKILL right after each committed transition of a one-node upgrade in turn, and a
fresh process finishes the run. Whatever the boundary, the driver object is patched once,
the node cordoned and uncordoned once, every step started once, and the node ends on the
new version, schedulable. gpuops driving (autoUpgrade off) deletes the driver pod once
and runs the canary pod once (created once, deleted once after it passed);
gpuops gating the operator (autoUpgrade on) holds the node back once and lets go once.
A canary that fails has its driver object set back: patched once each way, at any boundary.

Each round moves the pool to the other of two versions (the previous round's run left it
on its target), so every round is a real version change."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from storage import audit
from storage.database import open_database
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe


VERSIONS = ("580.95.05", "580.105.08")
IDENTITY = "engine-0"


DRIVES = fl.FleetSpec(name="upg", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
                      pools=(fl.PoolSpec(name="upg", nodes=1, driver_version=VERSIONS[0], auto_upgrade=False),))
GATES = fl.FleetSpec(name="upg", system_nodes=1, nudge_upgrade_controller=True,
                     operator=fl.OperatorSpec(auto_upgrade=True, driver_version=VERSIONS[0]),
                     pools=(fl.PoolSpec(name="upg", nodes=1),))
POLICY = GATES.operator.cluster_policy_name


def _steps(mode: str, version: str):
    if mode == "gates":
        return (("operator-hold", {"nodes": ["upg-01"]}),
                ("driver-version", {"object": "ClusterPolicy", "name": POLICY, "version": version}),
                ("cordon", {}), ("operator-upgrade", {"version": version, "timeout_s": 120}), ("uncordon", {}))
    return (("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": version}),
            ("cordon", {}), ("driver", {"version": version, "timeout_s": 120}),
            ("validate", {"timeout_s": 120}), ("gpu-check", CHECK),
            ("uncordon", {}))


# The canary pod, in a namespace of its own here (the engine runs as the admin).
CHECK = {"namespace": "gpu-checks", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
         "command": ["nvidia-smi"], "resource": "nvidia.com/gpu", "timeout_s": 60}


MUTATIONS = {
    "drives": {"patch nvidiadrivers upg-driver": 1, "cordon node upg-01": 1, "delete pod gpu-operator": 1,
               "create pod gpu-checks": 1, "delete pod gpu-checks": 1, "uncordon node upg-01": 1},
    "gates": {f"patch clusterpolicies {POLICY}": 1, "label node upg-01": 2, "cordon node upg-01": 1,
              "uncordon node upg-01": 1},
}


def _version_now(installer, mode: str) -> str:
    if mode == "gates":
        return installer.get({"kind": "ClusterPolicy", "metadata": {"name": POLICY}})["spec"]["driver"]["version"]
    return installer.get({"kind": "NVIDIADriver", "metadata": {"name": "upg-driver"}})["spec"]["version"]


def _one_round(cluster, tmp_path: Path, mode: str, crash_after: int, version: str) -> bool:
    installer = cluster.installer()
    db = open_database(tmp_path / f"round-{crash_after}.db")
    try:
        run = h.start_run(db, h.plan("upgrade", "upg", [["upg-01"]], _steps(mode, version)))
        logs = [tmp_path / f"round-{crash_after}-first.log", tmp_path / f"round-{crash_after}-second.log"]
        killed = h.crash_and_resume(cluster.kubeconfig, db.path, crash_after=crash_after, logs=logs,
                                    identity=IDENTITY, lease_name="upgrade-crash", timeout=150)

        where = f"crash after commit {crash_after} (to {version})"
        finished = h.wait_run(db, run.id, timeout=5)
        assert finished.state == "succeeded", (where, finished.halted_reason)
        calls = Counter(" ".join(m.split()[:3]).split("/")[0]
                        for log in logs if log.exists() for m in h.mutations(log.read_text()))
        assert calls == Counter(MUTATIONS[mode]), (where, calls)
        rows = audit.for_run(db, run.id)
        started = Counter(r.detail["kind"] for r in rows if r.action == "step.running")
        assert set(started.values()) == {1} and len(started) == len(_steps(mode, version)), (where, started)
        assert [(r.detail["from"], r.detail["to"]) for r in rows if r.action == "driver-version.set"] == [
            (VERSIONS[(VERSIONS.index(version) + 1) % 2], version)], where
        assert audit.verify(db).ok, where
        assert _version_now(installer, mode) == version, where
        wait_until(lambda: observe.node(installer, "upg-01")["metadata"]["labels"].get(
            "nvidia.com/cuda.driver-version.full") == version, timeout=30, what=f"upg-01 to report {version}")
        assert not h.unschedulable(installer, "upg-01"), where
        if mode == "drives":  # the check pod ran once, passed, and is gone
            assert [r.action for r in rows if r.action.startswith("gpu-check.")] == [
                "gpu-check.start", "gpu-check.passed"], where
            assert installer.list("Pod", namespace=CHECK["namespace"]) == [], where
        return killed
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["drives", "gates"])
def test_killing_the_engine_mid_upgrade_repeats_no_patch_cordon_or_restart_and_the_upgrade_completes(
        fleet, cluster, tmp_path, mode):
    fleet(GATES if mode == "gates" else DRIVES)
    installer = cluster.installer()
    installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHECK["namespace"]}},
                     exist_ok=True)
    wait_until(lambda: advertised(h.node(installer, "upg-01")) == 8, timeout=120, what="upg-01 to advertise its GPUs")

    boundaries = 0
    for crash_after in range(1, 40):
        version = VERSIONS[crash_after % 2]  # the other one than the pool runs now
        if not _one_round(cluster, tmp_path, mode, crash_after, version):
            break
        boundaries += 1
    else:
        pytest.fail("the first engine never finished the run by itself")
    print(f"{boundaries} crash points")
    assert boundaries >= 12  # every commit of the run was a crash point once (26 when gpuops drives)


# ---- a failed canary's driver object set back (the `on_failure` driver-version step)

ARMED = DRIVES.model_copy(update={"crashloop_driver_versions": (VERSIONS[1],)})
SET_BACK_STEPS = (("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": VERSIONS[1]}),
                  ("driver", {"version": VERSIONS[1], "timeout_s": 120}),
                  ("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": VERSIONS[1],
                                      "set_back": True, "on_failure": True}))


def _one_failed_round(cluster, tmp_path: Path, crash_after: int) -> bool:
    installer = cluster.installer()
    db = open_database(tmp_path / f"armed-{crash_after}.db")
    try:
        run = h.start_run(db, h.plan("upgrade", "upg", [["upg-01"]], SET_BACK_STEPS))
        logs = [tmp_path / f"armed-{crash_after}-first.log", tmp_path / f"armed-{crash_after}-second.log"]
        killed = h.crash_and_resume(cluster.kubeconfig, db.path, crash_after=crash_after, logs=logs,
                                    identity=IDENTITY, lease_name="upgrade-crash", timeout=150)

        where = f"crash after commit {crash_after}"
        finished = h.wait_run(db, run.id, timeout=5)
        assert finished.state == "failed", where
        assert "set back from" in (finished.halted_reason or ""), (where, finished.halted_reason)
        calls = Counter(" ".join(m.split()[:3]).split("/")[0]
                        for log in logs if log.exists() for m in h.mutations(log.read_text()))
        # Set, and set back: once each, whatever the boundary; the driver pod deleted once.
        assert calls == Counter({"patch nvidiadrivers upg-driver": 2, "delete pod gpu-operator": 1}), (where, calls)
        rows = audit.for_run(db, run.id)
        started = Counter(r.detail["step"] for r in rows if r.action == "step.running")
        assert set(started.values()) == {1} and len(started) == 3, (where, started)
        assert [(r.detail["from"], r.detail["to"]) for r in rows if r.action == "driver-version.set-back"] == [
            (VERSIONS[1], VERSIONS[0])], where
        assert audit.verify(db).ok, where
        assert _version_now(installer, "drives") == VERSIONS[0], where
        return killed
    finally:
        db.close()


def test_killing_the_engine_while_a_failed_canary_is_disarmed_patches_the_object_once_each_way(
        fleet, cluster, tmp_path):
    fleet(ARMED)
    installer = cluster.installer()
    wait_until(lambda: advertised(h.node(installer, "upg-01")) == 8, timeout=120, what="upg-01 to advertise its GPUs")

    boundaries = 0
    for crash_after in range(1, 40):
        if not _one_failed_round(cluster, tmp_path, crash_after):
            break
        boundaries += 1
    else:
        pytest.fail("the first engine never finished the run by itself")
    print(f"{boundaries} crash points")
    assert boundaries >= 8  # every commit of the run was a crash point once
