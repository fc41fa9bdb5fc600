"""SIGKILL of the engine at random points across many drain and upgrade runs (seeded, the
seed printed): 0 lost runs, 0 side effects twice.

Where tests/integration/test_engine_crash.py kills the engine right after each commit in
turn (every boundary once, the process's own hook), this kills it from outside after a
seeded random delay, so the kill lands anywhere: during start-up, between a write and the
commit that records it, in the middle of a call, in a wait. Each run is killed 1-3 times
(seeded) and a fresh process with the same identity (a restarted pod) resumes it; each
delay is drawn over the length of an undisturbed run measured first, counted from the
process's first commit (a kill during start-up would find nothing in flight). A run that
finishes before its first kill shortens that length to its own, and when too few kills
landed the suite runs a few more (at most `EXTRA_RUNS`), so the figure never rests on how
fast one run happened to be.

The engine runs as the bot's ServiceAccount (deploy/rbac.yaml), and what it did is read
from the API server's audit log (`testenv.apiaudit`), not from its own log: a write the
server took counts even when the process died before logging the answer, and a write that
was logged but never arrived does not.

A drain run: wave 1 drains kill-01 (cordon, evict its trainer pod, wait for the node's
GPUs, uncordon); wave 2 takes kill-02, which a person cordoned (the run marks it and must
leave it cordoned). An upgrade run (gpuops driving, autoUpgrade off): patch the
NVIDIADriver, cordon, restart the driver pod, wait for the driver and the validator, run
the canary pod, uncordon; each run moves to the other of two versions.

`make test` runs 3 drains and 1 upgrade; `make reliability` 100 and 20."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from storage import audit
from storage.database import Database, open_database
from testenv import fleet as fl
from testenv.apiaudit import AuditLog
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration.desk import bot_rbac_granted
from tests.reliability import figures


DRAINS = figures.count(3, 100)
UPGRADES = figures.count(1, 20)
EXTRA_RUNS = 3  # runs beyond the count when too few kills landed inside one
IDENTITY = "engine-0"  # a restarted pod keeps its name
DRAIN_FLEET = fl.FleetSpec(name="kill", system_nodes=0, pools=(fl.PoolSpec(name="kill", nodes=2),),
                           special_nodes=(fl.SpecialNode(node="kill-02", cordoned=True),),
                           workloads=(fl.WorkloadSpec(name="trainer", namespace="killjobs", node="kill-01"),))
VERSIONS = ("580.95.05", "580.105.08")
UPGRADE_FLEET = fl.FleetSpec(name="upg", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
                             pools=(fl.PoolSpec(name="upg", nodes=1, driver_version=VERSIONS[0], auto_upgrade=False),))
# The canary pod in the bot's own namespace, where deploy/rbac.yaml lets it create pods.
CHECK = {"namespace": "gpuops", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "command": ["nvidia-smi"],
         "resource": "nvidia.com/gpu", "timeout_s": 60}


def _upgrade_steps(version: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return (("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": version}),
            ("cordon", {}), ("driver", {"version": version, "timeout_s": 120}), ("validate", {"timeout_s": 120}),
            ("gpu-check", CHECK), ("uncordon", {}))


class Killer:
    """Runs the queued work in engine processes as the bot, SIGKILLing them at seeded
    random moments, and keeps the tally."""

    def __init__(self, cluster, tmp_path: Path, rng: random.Random, *, lease_name: str) -> None:
        self.cluster, self.tmp_path, self.rng, self.lease_name = cluster, tmp_path, rng, lease_name
        self.kills = 0
        self.killed_runs = 0  # the runs killed in, extra ones counted
        self.horizon = 0.0  # how long a run works, first commit to last: the kills' range
        self.points: Counter[str] = Counter()  # the newest audit row (and its step) when a kill landed
        self.processes = 0

    def _process(self, db: Database, label: str) -> subprocess.Popen[bytes]:
        self.processes += 1
        return h.engine_process(self.cluster.kubeconfig, db.path, identity=IDENTITY, lease_name=self.lease_name,
                                log=self.tmp_path / f"{label}.log", context="bot")

    def undisturbed(self, db: Database, label: str, *, timeout: float) -> None:
        """Run the work in one process; how long it worked, from its first commit to its
        last, as the audit log's times say (its start-up, imports and the watch cache's
        first list, is not the run), becomes the horizon."""
        newest = _newest(db)
        process = self._process(db, label)
        assert _wait(process, timeout, self.tmp_path / f"{label}.log") == 0
        self.horizon = _worked(db, after=newest)

    def runs(self, count: int, *, needed: int) -> Iterator[int]:
        """The runs to kill in, numbered from 1: `count` of them, and up to EXTRA_RUNS more
        while fewer than `needed` kills landed."""
        index = 1
        while index <= count or (self.kills < needed and index <= count + EXTRA_RUNS):
            yield index
            self.killed_runs = index
            index += 1

    def run_with_kills(self, db: Database, label: str, *, timeout: float) -> int:
        """Up to 1-3 kills, each after a delay drawn from [0, horizon) counted from the
        process's first commit; then a process runs the work to the end. Returns the
        kills that landed. A first process that outran its kill shortens the horizon to
        the time it took."""
        landed = 0
        for attempt in range(self.rng.randint(1, 3)):
            process = self._process(db, f"{label}-{attempt}")
            delay = self.rng.uniform(0.0, self.horizon)
            started = _newest(db)
            _first_commit(db, process, after=started)
            try:
                code = process.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
                landed += 1
                (newest,) = audit.recent(db, 1)
                kind = newest.detail.get("kind") if isinstance(newest.detail, dict) else None
                self.points[f"{newest.action} {kind}" if kind else newest.action] += 1
                continue
            assert code == 0, (self.tmp_path / f"{label}-{attempt}.log").read_text()
            if attempt == 0 and _newest(db) > started:
                self.horizon = min(self.horizon, _worked(db, after=started))
            break  # it finished before the kill: nothing left to kill
        final = self._process(db, f"{label}-final")
        assert _wait(final, timeout, self.tmp_path / f"{label}-final.log") == 0
        self.kills += landed
        return landed


def _newest(db: Database) -> int:
    newest = audit.recent(db, 1)
    return int(newest[0].seq) if newest else 0


def _worked(db: Database, *, after: int) -> float:
    """Seconds from the first audit row after `after` to the newest."""
    rows = [r for r in audit.recent(db, 1000) if r.seq > after]
    return (max(r.at for r in rows) - min(r.at for r in rows)).total_seconds()


def _first_commit(db: Database, process: subprocess.Popen[bytes], *, after: int) -> None:
    """Wait for the process to commit something (or to end: a run with nothing left),
    looking often: the delay to the kill counts from here."""
    deadline = time.monotonic() + 60
    while _newest(db) <= after and process.poll() is None:
        assert time.monotonic() < deadline, "the engine process committed nothing in 60 s"
        time.sleep(0.01)


def _wait(process: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    """The process's exit code; a process still working after `timeout` is killed and
    the test fails with the end of its log (what it was waiting for)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise AssertionError(f"the engine process did not finish in {timeout:.0f} s; its log ends:\n{tail}") from None


def _pod_on(installer, namespace: str, app: str) -> dict[str, Any]:
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, namespace, app)),
               timeout=90, what=f"a running {app} pod")
    (pod,) = [p for p in h.workload_pods(installer, namespace, app) if h.running_ready(p)]
    return pod


def _check_drain(cluster, db: Database, run_id, writes: Counter[str], pod: dict[str, Any], where: str) -> None:
    installer = cluster.installer()
    finished = h.wait_run(db, run_id, timeout=5)
    assert finished.state == "succeeded", (where, finished.halted_reason)
    pod_name = f"killjobs/{pod['metadata']['name']}"
    assert writes == Counter({"cordon nodes kill-01": 1, f"evict pods {pod_name}": 1, "uncordon nodes kill-01": 1,
                              "annotate nodes kill-02": 2}), (where, writes)  # the mark on, then off
    assert not h.unschedulable(installer, "kill-01") and h.cordon_mark(installer, "kill-01") is None, where
    assert h.unschedulable(installer, "kill-02") and h.cordon_mark(installer, "kill-02") is None, where  # the person's
    rows = audit.for_run(db, run_id)
    assert [r.target for r in rows if r.action == "pod.evict"] == [pod_name], where


def test_random_kills_across_drain_runs_lose_no_run_and_repeat_no_side_effect(fleet, cluster, tmp_path):
    fleet(DRAIN_FLEET)
    installer = cluster.installer()
    with bot_rbac_granted(installer):
        wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in ("kill-01", "kill-02")),
                   timeout=60, what="the fleet to advertise its GPUs")
        rng = random.Random(figures.SEED)
        print(f"\nrandom kills: seed {figures.SEED}, {DRAINS} drain runs")
        log = AuditLog(cluster.plane.audit_log)
        killer = Killer(cluster, tmp_path, rng, lease_name="kill-drains")
        db = open_database(tmp_path / "drains.db")
        try:
            for index in itertools.chain([0], killer.runs(DRAINS, needed=DRAINS // 2)):  # run 0 sets the horizon
                pod = _pod_on(installer, "killjobs", "trainer")
                mark = log.mark()
                run = h.start_run(db, h.plan("drain", "kill", [["kill-01"], ["kill-02"]]))
                if index == 0:
                    killer.undisturbed(db, "drain-0", timeout=120)
                else:
                    killer.run_with_kills(db, f"drain-{index}", timeout=120)
                _check_drain(cluster, db, run.id, log.counts(since=mark), pod, f"drain {index} (seed {figures.SEED})")
            assert audit.verify(db).ok
        finally:
            db.close()
        print(f"{killer.kills} kills landed; the newest audit row at each: {dict(killer.points)}")
        assert killer.kills >= DRAINS // 2  # most kills land inside a run, not after it
        figures.record("kills-drains", {
            "runs": killer.killed_runs, "kills": killer.kills, "engine_processes": killer.processes,
            "horizon_s": round(killer.horizon, 2), "lost_runs": 0, "side_effects_twice": 0, "human_cordons_undone": 0,
            "audit_chain": "verifies", "kill_points": dict(sorted(killer.points.items()))})


def test_random_kills_across_upgrade_runs_lose_no_run_and_repeat_no_side_effect(fleet, cluster, tmp_path):
    fleet(UPGRADE_FLEET)
    installer = cluster.installer()
    with bot_rbac_granted(installer):
        wait_until(lambda: advertised(h.node(installer, "upg-01")) == 8, timeout=120, what="upg-01 to advertise")
        rng = random.Random(figures.SEED + 1)
        print(f"\nrandom kills: seed {figures.SEED}, {UPGRADES} upgrade runs")
        log = AuditLog(cluster.plane.audit_log)
        killer = Killer(cluster, tmp_path, rng, lease_name="kill-upgrades")
        db = open_database(tmp_path / "upgrades.db")
        try:
            for index in itertools.chain([0], killer.runs(UPGRADES, needed=max(1, UPGRADES // 2))):  # run 0 sets the horizon
                version = VERSIONS[(index + 1) % 2]  # the other one than the pool runs now
                where = f"upgrade {index} to {version} (seed {figures.SEED})"
                mark = log.mark()
                run = h.start_run(db, h.plan("upgrade", "upg", [["upg-01"]], _upgrade_steps(version)))
                if index == 0:
                    killer.undisturbed(db, "upgrade-0", timeout=180)
                else:
                    killer.run_with_kills(db, f"upgrade-{index}", timeout=180)
                finished = h.wait_run(db, run.id, timeout=5)
                assert finished.state == "succeeded", (where, finished.halted_reason)
                writes = log.writes(since=mark)
                by_kind = Counter(f"{w.what} {w.resource}" + (f" {w.target.split('/')[0]}" if "/" in w.target else "")
                                  for w in writes)
                assert by_kind == Counter({"patch nvidiadrivers": 1, "cordon nodes": 1, "delete pods gpu-operator": 1,
                                           "create pods gpuops": 1, "delete pods gpuops": 1,
                                           "uncordon nodes": 1}), (where, [str(w) for w in writes])
                node = h.node(installer, "upg-01")
                assert not node["spec"].get("unschedulable"), where
                wait_until(lambda: h.node(installer, "upg-01")["metadata"]["labels"].get(
                    "nvidia.com/cuda.driver-version.full") == version, timeout=60, what=f"upg-01 on {version}")
                wait_until(lambda: installer.list("Pod", namespace="gpuops", selector="gpuops.io/gpu-check=true") == [],
                           timeout=60, what="the canary pod to be gone")
            assert audit.verify(db).ok
        finally:
            db.close()
        print(f"{killer.kills} kills landed; the newest audit row at each: {dict(killer.points)}")
        assert killer.kills >= max(1, UPGRADES // 2)
        figures.record("kills-upgrades", {
            "runs": killer.killed_runs, "kills": killer.kills, "engine_processes": killer.processes,
            "horizon_s": round(killer.horizon, 2), "lost_runs": 0, "side_effects_twice": 0,
            "audit_chain": "verifies", "kill_points": dict(sorted(killer.points.items()))})
