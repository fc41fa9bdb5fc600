"""One active engine: replicas elect it with a coordination.k8s.io/v1 Lease on the real
API server, and a replica that dies hands over only once its claim has run out."""

from __future__ import annotations

import dataclasses

import datetime as dt
import signal
import threading
import time
from pathlib import Path

from storage import audit
from storage.database import open_database
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration import engine_harness as h
from workflows.engine.lease import EngineLease
from workflows.kube.gateway import KubeGateway


def test_of_two_replicas_only_one_holds_the_lease_and_the_other_takes_over_once_the_dead_holders_claim_ran_out(
        cluster):
    settings = h.lease_settings("lease-electors", seconds=2)
    a = EngineLease(KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin"), identity="replica-a",
                    settings=settings)
    b = EngineLease(KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin"), identity="replica-b",
                    settings=settings)
    overlaps: list[float] = []
    done = threading.Event()

    def watch_both() -> None:
        while not done.wait(0.005):
            if a.held() and b.held():
                overlaps.append(time.monotonic())

    watcher = threading.Thread(target=watch_both, daemon=True)
    watcher.start()
    try:
        a.start()
        wait_until(a.held, timeout=10, what="replica-a to take the free lease")
        b.start()
        renewals = a.writes
        # Over several of a's renewals, b reads the lease, sees a hold it, and stays out.
        wait_until(lambda: a.writes >= renewals + 4, timeout=10, what="replica-a to renew four times")
        assert not b.held() and b.holder == "replica-a" and b.last_problem == "held by replica-a"

        a.stop(release=False)  # dies: no more renewals, nothing handed back
        last_claim_ends = a.deadline
        wait_until(b.held, timeout=10, what="replica-b to take the lease over")
        assert b.acquired_at[-1] >= last_claim_ends
        assert not a.held()
    finally:
        done.set()
        watcher.join()
        b.stop(release=True)
        a.stop(release=False)
    assert overlaps == []
    # Released on the way out: the next replica need not wait.
    record = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin").get_lease("default",
                                                                                           "lease-electors")
    assert record.holder is None and record.transitions == 1


def _log_time(line: str) -> dt.datetime:
    return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_two_engine_processes_never_act_at_once_and_the_survivor_finishes_the_run_when_the_holder_is_killed(
        fleet, cluster, tmp_path: Path):
    fleet(fl.FleetSpec(name="lease", system_nodes=0, pools=(fl.PoolSpec(name="lease", nodes=2),)))
    db = open_database(tmp_path / "gpuops.db")
    # lease-01's hold is long enough that engine-a still holds it when it is killed on a
    # machine busy with other tests (at 3 s it had once moved on to lease-02); lease-02's
    # is short.
    first, second = (h.plan("drain", "lease", [[node]], (("cordon", {}), ("hold", {"seconds": seconds}),
                                                          ("uncordon", {})))
                     for node, seconds in (("lease-01", 15), ("lease-02", 2)))
    run = h.start_run(db, dataclasses.replace(first, waves=(first.waves[0],
                                                            dataclasses.replace(second.waves[0], index=1))))
    logs = {name: tmp_path / f"{name}.log" for name in ("engine-a", "engine-b")}
    a = h.engine_process(cluster.kubeconfig, db.path, identity="engine-a", lease_name="lease-engines",
                         lease_seconds=2, log=logs["engine-a"])
    try:
        wait_until(lambda: "engine-a holds lease" in logs["engine-a"].read_text(), timeout=30,
                   what="engine-a to take the lease")
        b = h.engine_process(cluster.kubeconfig, db.path, identity="engine-b", lease_name="lease-engines",
                             lease_seconds=2, log=logs["engine-b"])
        wait_until(lambda: "held by engine-a" in logs["engine-b"].read_text(), timeout=30,
                   what="engine-b to find the lease taken")
        wait_until(lambda: any(r.action == "step.running" and r.detail["kind"] == "hold"
                               for r in audit.for_run(db, run.id)), timeout=30, what="engine-a to start holding")
        a.send_signal(signal.SIGKILL)
        assert a.wait(timeout=10) == -signal.SIGKILL
        assert b.wait(timeout=60) == 0, logs["engine-b"].read_text()
    finally:
        for process in (a, locals().get("b")):
            if process is not None and process.poll() is None:
                process.kill()

    assert h.wait_run(db, run.id, timeout=5).state == "succeeded"
    # Everything engine-a recorded comes before everything engine-b recorded.
    replicas = [r.detail["replica"] for r in audit.for_run(db, run.id) if r.actor == "gpuops"]
    handover = replicas.index("engine-b")
    assert set(replicas[:handover]) == {"engine-a"} and set(replicas[handover:]) == {"engine-b"}
    first_b = [r for r in audit.for_run(db, run.id) if r.actor == "gpuops"][handover]
    assert (first_b.action, first_b.target, first_b.detail["kind"]) == ("step.resumed", "lease-01", "hold")
    # engine-a cordoned lease-01; engine-b did the rest, and only after engine-a's last call.
    texts = {name: log.read_text() for name, log in logs.items()}
    assert h.mutations(texts["engine-a"]) == ["cordon node lease-01"]
    assert h.mutations(texts["engine-b"]) == ["uncordon node lease-01", "cordon node lease-02",
                                              "uncordon node lease-02"]
    last_a = max(_log_time(line) for line in texts["engine-a"].splitlines() if "mutation: " in line)
    took_over = next(_log_time(line) for line in texts["engine-b"].splitlines() if "engine-b holds lease" in line)
    assert took_over > last_a
    assert not h.unschedulable(cluster.installer(), "lease-01") and audit.verify(db).ok
    db.close()
