"""Crash safety: the engine process is killed with SIGKILL right after each committed
transition of a two-node run in turn, and a fresh process finishes the run.

The run: wave 1 drains crash-01 (cordon, evict its GPU pod, uncordon); wave 2 takes
crash-02, which a human cordoned before the run (cordon marks it, uncordon must leave it
cordoned). For N = 1, 2, ... the first process kills itself after its Nth commit
(GPUOPS_TEST_CRASH_AFTER=N); a second process with the same replica identity (a
restarted pod) resumes and finishes. The loop ends when the first process finishes the
run without reaching N commits, so every boundary of this run is covered.

What each round proves, from the API calls both processes logged ("mutation: ...",
written before each call is sent) and from the database: each node was cordoned (or
marked) once, the pod was evicted once, crash-01 was uncordoned once and crash-02 never,
every step started once, the run succeeded and the audit chain verifies.
"""

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


STEPS = (("cordon", {}), ("evict", {}), ("uncordon", {}))
IDENTITY = "engine-0"  # a StatefulSet pod keeps its name across restarts


def _one_round(cluster, tmp_path: Path, crash_after: int) -> tuple[bool, list[str]]:
    """Run the plan with a crash after commit `crash_after`; True if the first process
    was killed (False: it finished first, so there are no more boundaries to try)."""
    installer = cluster.installer()
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, "crashjobs", "trainer")),
               timeout=60, what="a trainer pod to run on crash-01")
    (pod,) = [p for p in h.workload_pods(installer, "crashjobs", "trainer") if h.running_ready(p)]
    db = open_database(tmp_path / f"round-{crash_after}.db")
    try:
        run = h.start_run(db, h.plan("drain", "crash", [["crash-01"], ["crash-02"]], STEPS))
        logs = [tmp_path / f"round-{crash_after}-first.log", tmp_path / f"round-{crash_after}-second.log"]
        killed = h.crash_and_resume(cluster.kubeconfig, db.path, crash_after=crash_after, logs=logs,
                                    identity=IDENTITY, lease_name="crash-test")

        where = f"crash after commit {crash_after}"
        finished = h.wait_run(db, run.id, timeout=5)
        assert finished.state == "succeeded", (where, finished.halted_reason)
        calls = Counter(" ".join(m.split()[:3]).split(" uid=")[0]
                        for log in logs if log.exists() for m in h.mutations(log.read_text()))
        pod_name = f"crashjobs/{pod['metadata']['name']}"
        assert calls == Counter({
            "cordon node crash-01": 1,
            f"evict pod {pod_name}": 1,
            "uncordon node crash-01": 1,
            "annotate node crash-02": 2,  # the mark, and taking it off again
        }), where
        # Each step started once, whatever the boundary; the pod's eviction is on record once.
        rows = audit.for_run(db, run.id)
        started = Counter((r.target, r.detail["kind"]) for r in rows if r.action == "step.running")
        assert set(started.values()) == {1} and len(started) == 6, (where, started)
        assert [r.target for r in rows if r.action == "pod.evict"] == [pod_name], where
        assert audit.verify(db).ok, where
        # The cluster ends as it should: crash-01 schedulable again, crash-02 still the human's.
        assert not h.unschedulable(installer, "crash-01") and h.cordon_mark(installer, "crash-01") is None, where
        assert h.unschedulable(installer, "crash-02") and h.cordon_mark(installer, "crash-02") is None, where
        assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in
                                              h.workload_pods(installer, "crashjobs", "trainer")}, where
        resumed = [r for r in rows if r.action == "step.resumed"]
        return killed, [f"{r.target}:{r.detail['kind']}" for r in resumed]
    finally:
        db.close()


def test_killing_the_engine_after_any_committed_transition_repeats_no_side_effect_and_the_run_completes(
        fleet, cluster, tmp_path):
    fleet(fl.FleetSpec(name="crash", system_nodes=0, pools=(fl.PoolSpec(name="crash", nodes=2),),
                       special_nodes=(fl.SpecialNode(node="crash-02", cordoned=True),),
                       workloads=(fl.WorkloadSpec(name="trainer", namespace="crashjobs", node="crash-01"),)))
    installer = cluster.installer()
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in ("crash-01", "crash-02")),
               timeout=60, what="the crash fleet to advertise its GPUs")

    boundaries = 0
    resumed_steps: set[str] = set()
    for crash_after in range(1, 40):
        killed, resumed = _one_round(cluster, tmp_path, crash_after)
        resumed_steps.update(resumed)
        if not killed:
            break
        boundaries += 1
    else:
        pytest.fail("the first engine never finished the run by itself")
    print(f"{boundaries} crash points; steps resumed after a crash: {sorted(resumed_steps)}")
    # Every commit of the run was a crash point once, including mid-step ones.
    assert boundaries >= 15
    assert {"crash-01:cordon", "crash-01:evict", "crash-01:uncordon", "crash-02:cordon",
            "crash-02:uncordon"} <= resumed_steps
