"""Drains and upgrades through a faulty API path (seeded, the seed printed): every run ends
succeeded or halted with its reason, 0 side effects twice, 0 human cordons undone, the
audit chain verifies, and the engine's watch cache misses no change.

The path: the engine (in a thread, as the bot's ServiceAccount with deploy/rbac.yaml)
reaches the API through Toxiproxy (`testenv.toxiproxy`), whose toxics each hit 10% of
connections: latency, connections reset, connections stalled until they close, closes
held back. Behind the proxy is a second API server on the same etcd without a watch cache
(`testenv.uncached_apiserver`), so a watch resumed after a compaction meets 410 Gone. On
the server side a validating admission webhook (`testenv.admission`) refuses 10% of the
bot's writes with 429, 500 or 409, and records every write it let through: that record,
not the engine's own log, is what "no side effect twice" is counted on, and, by request,
the audit log of the server behind the proxy (the writes it answered 2xx) too. A
succeeded run must have let through exactly its writes, each once. During each run
a seeded chaos thread compacts etcd and then cuts every connection through the proxy
(watches and writes in flight alike), so each run meets dropped watches and 410s.

After each run the engine's watch cache is compared with a fresh list through the
control plane's own API server (not through the proxy): the same objects, at the same
resourceVersions, within a minute.

A drain run: wave 1 drains drain-01 (cordon, evict its trainer pod, wait for its GPUs,
uncordon); wave 2 takes drain-02, which a person cordoned (the run marks it and must leave
it cordoned). An upgrade run (gpuops driving, autoUpgrade off): patch the NVIDIADriver,
cordon upg-01, restart its driver pod, wait for the driver and the validator, run the
canary pod, uncordon; each run moves to the other of two versions.

`make test` runs 3 drains and 1 upgrade; `make reliability` 50 and 10."""

from __future__ import annotations

import json
import logging
import random
import threading
import urllib.error
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import runs as stored_runs
from storage.database import open_database
from testenv import fleet as fl
from testenv.admission import Admitted, RefusingWebhook
from testenv.controlplane import BOT_USER
from testenv.install import wait_until
from testenv.summary import advertised
from testenv.toxiproxy import TOXIPROXY_VERSION, Toxiproxy, kubeconfig_via
from testenv.uncached_apiserver import UncachedApiServer
from tests.integration import engine_harness as h
from tests.integration.desk import bot_rbac_granted
from tests.reliability import figures
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.client import observe_kube_calls
from workflows.kube.labels import ANNOTATION_CORDONED_BY


DRAINS = figures.count(3, 50)
UPGRADES = figures.count(1, 10)
VERSIONS = ("580.95.05", "580.105.08")
FLEET = fl.FleetSpec(
    name="faults", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
    pools=(fl.PoolSpec(name="drain", nodes=2),
           fl.PoolSpec(name="upg", nodes=1, driver_version=VERSIONS[0], auto_upgrade=False)),
    special_nodes=(fl.SpecialNode(node="drain-02", cordoned=True),),
    workloads=(fl.WorkloadSpec(name="trainer", namespace="faultjobs", node="drain-01"),))
HUMAN_CORDONED = "drain-02"
# The canary pod in the bot's own namespace, where deploy/rbac.yaml lets it create pods.
CHECK = {"namespace": "gpuops", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "command": ["nvidia-smi"],
         "resource": "nvidia.com/gpu", "timeout_s": 60}
# Each on 10% of connections (drawn per connection as it starts), milliseconds.
TOXICS: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("latency", "latency", {"latency": 300, "jitter": 200}),
    ("reset", "reset_peer", {"timeout": 1500}),
    ("stall", "timeout", {"timeout": 2000}),
    ("slow-close", "slow_close", {"delay": 1000}),
)
TOXICITY = 0.1
REFUSED_SHARE = 0.1
RESOURCES = ("nodes", "pods", "deployments", "daemonsets", "toolkits", "clusterpolicies", "nvidiadrivers")


def _upgrade_steps(version: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return (("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": version}),
            ("cordon", {}), ("driver", {"version": version, "timeout_s": 120}), ("validate", {"timeout_s": 120}),
            ("gpu-check", CHECK), ("uncordon", {}))


# --- the faulty path ---------------------------------------------------------------------


class FaultyEngine:
    """The engine in a thread of the test process, as the bot, through `kubeconfig` (the
    proxy's); its watch cache stays reachable for the comparisons."""

    def __init__(self, kubeconfig: Path, db_path: Path) -> None:
        self.gateway = KubeGateway.connect(kubeconfig=kubeconfig, context="bot")
        self.cache = FleetCache(self.gateway, settings=h.CONFIG.inventory_settings()).start()
        self.db_path = db_path
        self.engine: Engine | None = None
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-faults", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = open_database(self.db_path)  # a connection of the engine's own thread
        try:
            self.engine = Engine(db=db, gateway=self.gateway, cache=self.cache, lease=AlwaysHeld(),
                                 replica="engine-faults", settings=h.FAST)
            self.engine.run(self.stop)
        except BaseException as err:  # noqa: BLE001 - raised by wait_run() and close()
            self.error = err
        finally:
            db.close()

    def wait_run(self, db, run_id, *, timeout: float):
        """The run once it ended; the engine's own error if it stopped first."""
        def ended() -> bool:
            if self.error is not None:
                raise self.error
            run = stored_runs.get(db, id=run_id)
            return run is not None and run.state in ("succeeded", "failed", "aborted")

        wait_until(ended, timeout=timeout, what=f"run {run_id} to end")
        return stored_runs.get(db, id=run_id)

    def wake(self) -> None:
        if self.engine is not None:
            self.engine.wake()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=30)
        self.cache.stop()
        if self.error is not None:
            raise self.error

    def totals(self) -> tuple[int, int]:
        """(watches opened, relists after 410) over every watched resource."""
        return (sum(self.cache.watches(r) for r in RESOURCES), sum(self.cache.relists(r) for r in RESOURCES))


@dataclass
class Chaos:
    """While a run goes on: at seeded moments, compact etcd and then cut every connection
    through the proxy for a moment (a watch resumed after the compaction meets 410)."""

    toxiproxy: Toxiproxy
    proxy: Any
    cluster: Any
    rng: random.Random
    cuts: int = 0
    compactions: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        first = True  # soon after the run starts: even a short run meets one
        while not self._stop.wait(self.rng.uniform(0.1, 1.0) if first else self.rng.uniform(0.5, 2.5)):
            first = False
            try:
                self.cluster.plane.compact_etcd()
                self.compactions += 1
            except urllib.error.HTTPError:
                pass  # nothing written since the last compaction: etcd refuses to compact again
            self.toxiproxy.set_enabled(self.proxy, False)
            self.cuts += 1
            self._stop.wait(self.rng.uniform(0.1, 0.5))
            self.toxiproxy.set_enabled(self.proxy, True)

    def __enter__(self) -> Chaos:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)
        self.toxiproxy.set_enabled(self.proxy, True)


# --- what is checked ---------------------------------------------------------------------


def admitted_key(write: Admitted) -> str:
    """A write as both records name it: what it did and to which object."""
    if write.resource == "nodes":
        return f"{write.change} node {write.name}"
    if write.resource == "pods/eviction":
        return f"evict pod {write.target}"
    if write.resource == "pods":
        return f"{write.operation.lower()} pod {write.target}"
    return f"patch {write.resource} {write.name}"


def _node_patch(body: dict[str, Any]) -> str:
    """A node patch gpuops sent, by its body: cordon, uncordon, mark, unmark or labels."""
    unschedulable = (body.get("spec") or {}).get("unschedulable")
    if unschedulable is not None:
        return "cordon" if unschedulable else "uncordon"
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_CORDONED_BY in annotations:
        return "mark" if annotations[ANNOTATION_CORDONED_BY] else "unmark"
    return "labels" if (body.get("metadata") or {}).get("labels") else "patch"


class ServerRecord:
    """The bot's writes as the server behind the proxy answered them, from its audit log
    (the control plane's audit policy: the bot's writes with their bodies), by request.

    A request the server gave up on because its client went away (504: the proxy cut the
    connection) may come after the webhook admitted it; the engine, finding the effect
    missing, sends it again. Such a write is admitted twice and done once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def answers(self, *, since: int) -> tuple[Counter[str], Counter[str]]:
        """(writes answered 2xx, writes the server gave up on: 504), by `admitted_key`."""
        done: Counter[str] = Counter()
        cancelled: Counter[str] = Counter()
        if not self.path.exists():
            return done, cancelled  # a server without an audit policy: the webhook's count stands alone
        with self.path.open("rb") as log:
            log.seek(since)
            data = log.read()
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            code = (event.get("responseStatus") or {}).get("code", 0)
            if "dryRun=" in event.get("requestURI", "") or ref.get("resource") in ("leases", None):
                continue
            target = "/".join(p for p in (ref.get("namespace"), ref.get("name")) if p)
            if ref.get("resource") == "nodes":
                key = f"{_node_patch(event.get('requestObject') or {})} node {target}"
            elif ref.get("subresource") == "eviction":
                key = f"evict pod {target}"
            elif ref.get("resource") == "pods":
                key = f"{event['verb']} pod {target}"
            else:
                key = f"patch {ref.get('resource')} {target}"
            if 200 <= code < 300:
                done[key] += 1
            elif code == 504:
                cancelled[key] += 1
        return done, cancelled


def duplicates(writes: list[Admitted], done: Counter[str], cancelled: Counter[str]) -> dict[str, int]:
    """Side effects made more than once in one run (a node cordoned, uncordoned, marked
    or unmarked twice, a pod evicted, deleted or created twice, a driver object patched
    twice), by either record: the server answered a write 2xx twice, or the webhook
    admitted it twice more often than the server gave up on one of them."""
    admitted = Counter(admitted_key(w) for w in writes if not w.second_pass)
    found = {f"{key} (server)": n for key, n in done.items() if n > 1}
    found.update({f"{key} (webhook)": n - cancelled[key] for key, n in admitted.items() if n - cancelled[key] > 1})
    return found


def shape(writes: list[Admitted], cancelled: Counter[str]) -> Counter[str]:
    """The side effects a run made, by kind and object (pods by namespace only: their
    names change from run to run)."""
    found: Counter[str] = Counter()
    for key, n in Counter(admitted_key(w) for w in writes if not w.second_pass).items():
        what, kind, target = key.split(" ", 2)
        named = f"{what} pod in {target.split('/')[0]}" if kind == "pod" else (
            f"{what} {target}" if kind == "node" else key)
        # NB: a request the server gave up on may still have been stored (its storage
        # call outlives the 504); a write admitted at all made its effect at least once.
        found[named] += max(n - cancelled[key], 1)
    return found


# What a run that succeeded let through, exactly once each.
DRAIN_WRITES = Counter({"cordon drain-01": 1, "evict pod in faultjobs": 1, "uncordon drain-01": 1,
                        "mark drain-02": 1, "unmark drain-02": 1})
UPGRADE_WRITES = Counter({"patch nvidiadrivers upg-driver": 1, "cordon upg-01": 1, "delete pod in gpu-operator": 1,
                          "create pod in gpuops": 1, "delete pod in gpuops": 1, "uncordon upg-01": 1})


def _views(snapshot) -> dict[str, dict[str, Any]]:
    return {
        "nodes": dict(snapshot.nodes),
        "pods": {f"{p.namespace}/{p.name}": p for p in snapshot.pods},
        "clusterpolicies": {c.name: c for c in snapshot.cluster_policies},
        "nvidiadrivers": {c.name: c for c in snapshot.nvidia_drivers},
        "daemonsets": {f"{d.namespace}/{d.name}": d for d in snapshot.driver_templates},
        "deployments": {"operator": snapshot.operator_deployment} if snapshot.operator_deployment else {},
    }


def cache_differences(cache: FleetCache, direct: KubeGateway) -> list[str]:
    """What the engine's watch cache holds that a fresh list (through `direct`, the
    control plane's own API server) does not, object by object."""
    fresh = FleetCache(direct, settings=h.CONFIG.inventory_settings()).start(watch=False)
    now = h.now()
    cached, listed = _views(cache.snapshot(now)), _views(fresh.snapshot(now))
    found = []
    for resource, objects in listed.items():
        mine = cached[resource]
        for key in sorted(set(objects) | set(mine)):
            if objects.get(key) != mine.get(key):
                found.append(f"{resource} {key}: cache at {getattr(mine.get(key), 'resource_version', None)!r}, "
                             f"list at {getattr(objects.get(key), 'resource_version', None)!r}")
    return found


def cache_mismatch(cache: FleetCache, direct: KubeGateway, *, timeout: float = 120) -> list[str]:
    """The differences left once the cache had `timeout` seconds to catch up ([] when it
    did): a change it missed never arrives, one on its way does."""
    last: list[str] = []

    def caught_up() -> bool:
        last[:] = cache_differences(cache, direct)
        return not last

    try:
        wait_until(caught_up, timeout=timeout, what="the watch cache to match a fresh list")
    except TimeoutError:
        return last
    return []


def _pod_on(installer, namespace: str, app: str) -> dict[str, Any]:
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, namespace, app)),
               timeout=90, what=f"a running {app} pod")
    (pod,) = [p for p in h.workload_pods(installer, namespace, app) if h.running_ready(p)]
    return pod


def _give_back(installer, run_id: str, nodes: list[str]) -> None:
    """What a person does after a halted run (`/gpu uncordon`): nodes the run cordoned
    are given back as they were, its marks removed."""
    for name in nodes:
        mark = h.cordon_mark(installer, name)
        if not mark or run_id not in mark:
            continue
        prior = json.loads(mark).get("prior_unschedulable", False)
        installer.call("PATCH", f"/api/v1/nodes/{name}", content_type="application/merge-patch+json",
                       body={"metadata": {"annotations": {ANNOTATION_CORDONED_BY: None}},
                             "spec": {"unschedulable": bool(prior)}})


@dataclass
class Tally:
    runs: int = 0
    succeeded: int = 0
    halted: Counter[str] = field(default_factory=Counter)
    duplicates: dict[str, dict[str, int]] = field(default_factory=dict)
    human_cordons_undone: int = 0
    mismatches: dict[str, list[str]] = field(default_factory=dict)
    # A run that succeeded but let through other writes than it should have.
    unexpected: dict[str, dict[str, int]] = field(default_factory=dict)
    cancelled: int = 0  # writes the server gave up on (504) as the proxy cut their client off

    def end(self, where: str, run, writes: list[Admitted], installer, cache: FleetCache,
            direct: KubeGateway, answers: tuple[Counter[str], Counter[str]], expected: Counter[str]) -> None:
        self.runs += 1
        done, cancelled = answers
        self.cancelled += sum(cancelled.values())
        if run.state == "succeeded":
            self.succeeded += 1
            if (made := shape(writes, cancelled)) != expected:
                self.unexpected[where] = dict(made)
        else:
            # A run that did not finish must say why.
            assert run.halted_reason, (where, run.state)
            self.halted[f"{run.state}: {run.halted_reason}"] += 1
        if twice := duplicates(writes, done, cancelled):
            self.duplicates[where] = twice
        undone = [w for w in writes if w.resource == "nodes" and w.name == HUMAN_CORDONED and w.change == "uncordon"]
        self.human_cordons_undone += len(undone) + (0 if h.unschedulable(installer, HUMAN_CORDONED) else 1)
        if missed := cache_mismatch(cache, direct):
            self.mismatches[where] = missed


# About 10 s a drain and 30 s an upgrade on two cores, with room: the full counts take
# longer than the suite's default limit.
@pytest.mark.timeout(max(600, 30 * (DRAINS + 3 * UPGRADES)))
def test_drains_and_upgrades_through_api_faults_finish_or_halt_safely_and_the_cache_misses_nothing(
        fleet, cluster, tmp_path):
    fleet(FLEET)
    installer = cluster.installer()
    with bot_rbac_granted(installer):
        _drains_and_upgrades_through_faults(cluster, installer, tmp_path)


def _drains_and_upgrades_through_faults(cluster, installer, tmp_path: Path) -> None:
    print(f"\napi faults: seed {figures.SEED}, {DRAINS} drain runs, {UPGRADES} upgrade runs, "
          f"toxiproxy {TOXIPROXY_VERSION}")
    codes: Counter[tuple[str, str]] = Counter()
    uncached = UncachedApiServer(cluster.plane, tmp_path / "uncached")
    toxiproxy = Toxiproxy(folder=tmp_path / "toxiproxy", seed=figures.SEED)
    webhook = RefusingWebhook(name="gpuops-api-faults", user=BOT_USER, seed=figures.SEED, share=REFUSED_SHARE)
    engine: FaultyEngine | None = None
    db = None
    # What the engine meant to do ("mutation: ..." before each write), for reading after.
    engine_log = logging.FileHandler(tmp_path / "engine.log")
    engine_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    gpuops_log = logging.getLogger("gpuops")
    gpuops_log.addHandler(engine_log)
    level = gpuops_log.level
    gpuops_log.setLevel(logging.INFO)
    direct = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin")
    try:
        wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in ("drain-01", "drain-02", "upg-01")),
                   timeout=120, what="the fleet to advertise its GPUs")
        uncached.start()
        toxiproxy.start()
        proxy = toxiproxy.create_proxy("apiserver", uncached.address)
        proxied = kubeconfig_via(cluster.kubeconfig, proxy.server, tmp_path / "kubeconfig-proxied")
        webhook.start(installer)
        # The webhook answers the server behind the proxy before anything depends on it:
        # a dry-run patch as the bot reaches it (dry runs are recorded, never refused).
        probe = KubeGateway.connect(kubeconfig=proxied, context="bot")
        wait_until(lambda: _probe(probe, webhook), timeout=30, what="the webhook to see the bot's writes")
        probe.close()
        for name, kind, attributes in TOXICS:
            toxiproxy.add_toxic(proxy, name, kind, attributes, toxicity=TOXICITY)
        observe_kube_calls(lambda verb, code, _: codes.update([(verb, code)]))

        server = ServerRecord(uncached.audit_log)
        db = open_database(tmp_path / "faults.db")
        engine = FaultyEngine(proxied, db.path)
        chaos = Chaos(toxiproxy, proxy, cluster, random.Random(figures.SEED + 2))
        tally = Tally()
        for index in range(DRAINS):
            where = f"drain {index} (seed {figures.SEED})"
            _pod_on(installer, "faultjobs", "trainer")
            mark, server_mark = webhook.mark(), server.mark()
            run = h.start_run(db, h.plan("drain", "drain", [["drain-01"], ["drain-02"]]))
            engine.wake()
            with chaos:
                finished = engine.wait_run(db, run.id, timeout=180)
            tally.end(where, finished, webhook.writes(since=mark), installer, engine.cache, direct,
                      server.answers(since=server_mark), DRAIN_WRITES)
            if finished.state != "succeeded":
                _give_back(installer, run.id, ["drain-01", "drain-02"])
        drains_succeeded = tally.succeeded
        for index in range(UPGRADES):
            version = VERSIONS[(index + 1) % 2]
            where = f"upgrade {index} to {version} (seed {figures.SEED})"
            mark, server_mark = webhook.mark(), server.mark()
            run = h.start_run(db, h.plan("upgrade", "upg", [["upg-01"]], _upgrade_steps(version)))
            engine.wake()
            with chaos:
                finished = engine.wait_run(db, run.id, timeout=300)
            tally.end(where, finished, webhook.writes(since=mark), installer, engine.cache, direct,
                      server.answers(since=server_mark), UPGRADE_WRITES)
            if finished.state != "succeeded":
                _give_back(installer, run.id, ["upg-01"])
            wait_until(lambda: installer.list("Pod", namespace="gpuops", selector="gpuops.io/gpu-check=true") == [],
                       timeout=60, what="the canary pod to be gone")
        watches, relists = engine.totals()
        chain = audit.verify(db)
        # The fleet has no PodDisruptionBudget: a thread told of one was told wrong.
        budget_claims = [m for m in h.thread_messages(db) if "blocked by a PodDisruptionBudget" in json.dumps(m)]
        refused = Counter(r.refused for r in webhook.refusals)
        seen = {code for (verb, code) in codes if verb in ("PATCH", "POST", "DELETE")}
        print(f"runs {tally.runs}: {tally.succeeded} succeeded, halted {dict(tally.halted)}; "
              f"refused {dict(refused)}; write answers {dict(c for c in codes.items() if c[0][0] != 'GET')}; "
              f"{chaos.cuts} cuts, {chaos.compactions} compactions, {watches} watches opened, {relists} relists")
        figures.record("api-faults", {
            "toxiproxy": TOXIPROXY_VERSION,
            "drain_runs": DRAINS, "upgrade_runs": UPGRADES, "runs": tally.runs, "succeeded": tally.succeeded,
            "drains_succeeded": drains_succeeded, "halted": dict(tally.halted),
            "toxics": {name: {"type": kind, "toxicity": TOXICITY, **attributes} for name, kind, attributes in TOXICS},
            "webhook_refusals": {str(code): n for code, n in sorted(refused.items())},
            "refusal_codes_the_client_saw": sorted({str(code) for code in refused} & seen),
            "webhook_allowed_writes": len(webhook.writes()),
            "webhook_answers_the_server_hung_up_on": webhook.undelivered,
            "writes_the_server_gave_up_on_504": tally.cancelled,
            "webhook_readmitted_after_a_cancelled_request": (
                sum(1 for a in webhook.allowed if not a.dry_run) - len(webhook.writes())),
            "connection_cuts": chaos.cuts, "etcd_compactions": chaos.compactions,
            "watches_opened": watches, "relists_after_410": relists,
            "duplicates": sum(sum(d.values()) - len(d) for d in tally.duplicates.values()),
            "human_cordons_undone": tally.human_cordons_undone,
            "audit_chain": "verifies" if chain.ok else "broken",
            "watch_cache_mismatches": len(tally.mismatches),
            "watch_cache_mismatch_examples": {where: found[:3] for where, found in tally.mismatches.items()},
            "server_audit_log_checked": server.path.exists(),
            "thread_messages_claiming_a_budget": len(budget_claims),
            "succeeded_runs_with_other_writes": len(tally.unexpected)})
        assert tally.duplicates == {}, tally.duplicates
        assert tally.unexpected == {}, tally.unexpected
        assert tally.human_cordons_undone == 0
        assert tally.mismatches == {}, tally.mismatches
        assert chain.ok, chain
        assert budget_claims == [], budget_claims
        # The API server hands the webhook's code to the client (a refusal whose answer a
        # cut connection lost shows as a connection error instead, so not every one).
        assert {str(code) for code in refused} & seen, (refused, seen)
        assert relists > 0, "no watch met 410 Gone: the compactions did not reach it"
    finally:
        observe_kube_calls(None)
        gpuops_log.removeHandler(engine_log)
        gpuops_log.setLevel(level)
        engine_log.close()
        if engine is not None:
            engine.close()
        if db is not None:
            db.close()
        webhook.stop()
        toxiproxy.stop()
        uncached.stop()
        direct.close()


def _probe(gateway: KubeGateway, webhook: RefusingWebhook) -> bool:
    gateway.annotate_node("drain-01", annotations={"gpuops.io/fault-probe": None}, resource_version=None,
                          dry_run=True)
    return any(a.dry_run and a.resource == "nodes" for a in webhook.allowed)
