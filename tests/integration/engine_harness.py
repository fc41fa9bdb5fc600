"""Shared by the engine tests: a configuration whose pools need no approvals, plans,
requests that become runs, an engine in a thread or in a subprocess, and reading the
cluster and the database back."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storage import runs as stored_runs
from storage.database import Database, open_database
from storage.ids import RunId
from storage.runs import Run
from testenv.install import Installer, wait_until
from workflows.config import GpuopsConfig
from workflows.engine.lease import AlwaysHeld, LeaseSettings
from workflows.engine.loop import Engine, EngineSettings
from workflows.engine.runs import RunService, RunView
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = "C0GPUOPS"
NO_APPROVALS = {"drain": 0, "upgrade": 0, "mig": 0}
CONFIG = GpuopsConfig.model_validate({
    "pools": {name: {"kind": "training", "approvals": NO_APPROVALS}
              for name in ("drain", "pdb", "drv", "crash", "lease", "dry", "mig", "pause", "upg", "kill")},
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]},
               "names": {"U0ALICE": "alice", "U0ERIN": "erin"}},
})
ALICE = CONFIG.actor("U0ALICE")
DRAIN_STEPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("cordon", {}), ("evict", {}), ("wait-for", {}), ("uncordon", {}))


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def plan(kind: str, pool: str, waves: Sequence[Sequence[str]],
         steps: Sequence[tuple[str, dict[str, Any]]] = DRAIN_STEPS) -> Plan:
    return Plan(kind=kind, pool=pool, created_for=ALICE.user_id,  # type: ignore[arg-type]
                summary=PlanSummary(), waves=tuple(
        Wave(index, tuple(NodeName(n) for n in nodes),
             tuple(NodeStep(k, NodeName(n), p) for n in nodes for k, p in steps))  # type: ignore[arg-type]
        for index, nodes in enumerate(waves)))


def start_run(db: Database, the_plan: Plan, *, dry_run: bool = False,
              window: tuple[dt.datetime | None, dt.datetime | None] = (None, None)) -> RunView:
    """Submit a request for the plan (its pool needs no approval) and queue its run;
    `window` is the one the plan was made for (a planner's plan names it)."""
    request = RequestService(db, CONFIG).submit(
        ALICE, kind=the_plan.kind, pool=the_plan.pool, targets=list(the_plan.nodes), plan=the_plan,
        window_start=window[0], window_end=window[1], reason="engine test", channel=CHANNEL, now=now())
    assert request.state == "approved"
    return RunService(db).start(request.id, dry_run=dry_run, now=now(), actor=ALICE)


def wait_run(db: Database, run_id: RunId, states: Sequence[str] = ("succeeded", "failed", "aborted"),
             *, timeout: float = 90) -> Run:
    wait_until(lambda: (stored_runs.get(db, id=run_id) or _never()).state in states, timeout=timeout,
               what=f"run {run_id} to be {' or '.join(states)}")
    run = stored_runs.get(db, id=run_id)
    assert run is not None
    return run


def _never() -> Run:
    raise AssertionError("the run disappeared")


FAST = EngineSettings(control_check=dt.timedelta(milliseconds=200))


class EngineThread:
    """An engine in a thread of the test process, on its own database connection."""

    def __init__(self, kubeconfig: Path, db_path: Path, *, identity: str = "engine-test",
                 lease: Any = None, settings: EngineSettings = FAST, pools: Any = None,
                 clock: Any = None, user: str = "admin", health: Any = None, signals: Any = None) -> None:
        self.kubeconfig, self.db_path, self.identity = kubeconfig, db_path, identity
        self.user = user  # the kubeconfig context it acts as ("bot": the bot's ServiceAccount)
        self.lease = lease if lease is not None else AlwaysHeld()
        self.settings = settings
        self.pools = pools  # the pools checked before every wave (None: no check)
        self.clock = clock or now  # what the engine reads as the time
        self.health = health  # reads the pools' analysis queries between waves (None: no Prometheus)
        self.signals = signals  # reads each node's DCGM signals before and after its change (None: not)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.engine: Any = None
        self._thread = threading.Thread(target=self._run, name=f"engine-{identity}", daemon=True)

    def _run(self) -> None:
        gateway = KubeGateway.connect(kubeconfig=self.kubeconfig, context=self.user)
        cache = FleetCache(gateway, settings=CONFIG.inventory_settings()).start()
        db = open_database(self.db_path)
        try:
            self.engine = Engine(db=db, gateway=gateway, cache=cache, lease=self.lease, replica=self.identity,
                                 settings=self.settings, pools=self.pools, clock=self.clock, health=self.health,
                                 signals=self.signals)
            self.engine.run(self.stop)
        except BaseException as err:  # noqa: BLE001 - reported by __exit__
            self.error = err
        finally:
            cache.stop()
            db.close()

    def passes_after(self, more: int) -> None:
        """Wait until the engine has looked at the runs `more` more times."""
        wait_until(lambda: self.engine is not None, timeout=30, what="the engine to start")
        target = self.engine.passes + more
        wait_until(lambda: self.engine.passes >= target, timeout=30, what=f"{more} more engine passes")

    def __enter__(self) -> EngineThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=30)
        if self.error is not None:
            raise self.error


def engine_process(kubeconfig: Path, db_path: Path, *, identity: str, lease_name: str, log: Path,
                   crash_after: int | str | None = None, lease_seconds: float = 3.0,
                   exit_when_idle: bool = True, max_parallel_nodes: int | None = None,
                   context: str = "admin", module: str = "bot.engine_process") -> subprocess.Popen[bytes]:
    """`python -m bot.engine_process` (or `module`, one that runs it with more kinds of
    change) against the test control plane as `context` ("bot": the bot's
    ServiceAccount); its log goes to `log`."""
    env = {k: v for k, v in os.environ.items() if k != "GPUOPS_TEST_CRASH_AFTER"}
    if crash_after is not None:
        env["GPUOPS_TEST_CRASH_AFTER"] = str(crash_after)
    args = [sys.executable, "-m", module, "--db", str(db_path), "--kubeconfig", str(kubeconfig),
            "--context", context, "--identity", identity,
            # The bot's Lease is in its own namespace, where deploy/rbac.yaml lets it hold one.
            "--lease-namespace", "gpuops" if context == "bot" else "default",
            "--lease-name", lease_name, "--lease-seconds", str(lease_seconds)]
    if exit_when_idle:
        args.append("--exit-when-idle")
    if max_parallel_nodes is not None:
        args += ["--max-parallel-nodes", str(max_parallel_nodes)]
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def crash_and_resume(kubeconfig: Path, db_path: Path, *, crash_after: int, logs: Sequence[Path],
                     identity: str, lease_name: str, timeout: float = 90, context: str = "admin",
                     module: str = "bot.engine_process") -> bool:
    """Run the queued work in an engine process that SIGKILLs itself after its
    `crash_after`th commit; if it did, a second process with the same identity (a
    restarted pod) finishes. Returns whether the first was killed (False: it finished
    first, so this run has no commit `crash_after`). `logs`: the two processes' logs."""
    first = engine_process(kubeconfig, db_path, identity=identity, lease_name=lease_name, log=logs[0],
                           crash_after=crash_after, context=context, module=module)
    code = _wait_exit(first, timeout=timeout)
    killed = code == -signal.SIGKILL
    assert killed or code == 0, logs[0].read_text()
    if killed:
        second = engine_process(kubeconfig, db_path, identity=identity, lease_name=lease_name, log=logs[1],
                                context=context, module=module)
        assert _wait_exit(second, timeout=timeout) == 0, logs[1].read_text()
    return killed


def _wait_exit(process: subprocess.Popen[bytes], *, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except Exception:
        process.kill()
        raise


def lease_settings(name: str, seconds: float = 2.0) -> LeaseSettings:
    return LeaseSettings(namespace="default", name=name, duration=dt.timedelta(seconds=seconds))


# --- reading the cluster back -------------------------------------------------------------------

def node(installer: Installer, name: str) -> dict[str, Any]:
    return installer.get({"kind": "Node", "metadata": {"name": name}})


def unschedulable(installer: Installer, name: str) -> bool:
    return bool(node(installer, name).get("spec", {}).get("unschedulable"))


def cordon_mark(installer: Installer, name: str) -> str | None:
    return (node(installer, name)["metadata"].get("annotations") or {}).get(ANNOTATION_CORDONED_BY)


def cordon_by_hand(installer: Installer, name: str, *, cordoned: bool = True) -> None:
    installer.call("PATCH", f"/api/v1/nodes/{name}", body={"spec": {"unschedulable": cordoned}},
                   content_type="application/merge-patch+json")


def workload_pods(installer: Installer, namespace: str, app: str) -> list[dict[str, Any]]:
    return [p for p in installer.list("Pod", namespace=namespace, selector=f"app={app}")
            if not p["metadata"].get("deletionTimestamp")]


def running_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or ())


def attempts(log_text: str) -> list[str]:
    """Every write a gateway sent, whether or not the server refused it."""
    return [line.split("mutation: ", 1)[1].strip() for line in log_text.splitlines() if "mutation: " in line]


def mutations(log_text: str) -> list[str]:
    """The writes a gateway logged ("cordon node x", "evict pod ns/name uid=..."), in order."""
    done: list[str] = []
    for line in log_text.splitlines():
        if "mutation: " in line:
            done.append(line.split("mutation: ", 1)[1].strip())
        elif "mutation refused: " in line:  # the server changed nothing: not a write
            refused = line.split("mutation refused: ", 1)[1].rsplit(" (", 1)[0].strip()
            for index in range(len(done) - 1, -1, -1):
                if done[index] == refused:
                    del done[index]
                    break
    return done


def thread_messages(db: Database) -> list[dict[str, Any]]:
    """Every outbox payload, in order, delivered one by one as the notifier would."""
    from storage import outbox

    delivered: list[dict[str, Any]] = []
    while True:
        batch = outbox.claim_pending(db, limit=100, now=now())
        if not batch:
            return delivered
        for message in batch:
            delivered.append({**message.payload, "kind": message.kind})  # type: ignore[dict-item]
            outbox.mark_sent(db, id=message.id, message_ts=None, at=now())
