"""Kubernetes Events of a real drain, read back from the API as `kubectl describe node`
would find them: alice asks, bob approves, the engine drains the node as the bot's
ServiceAccount and the Lease holder's sender sends the Events it queued. Each names the
run, the request, who approved it and the window; the pods evicted one after the other are
one Event with a series, not one Event each; a repeat after an Event was sent patches
its series. A bot without the grant on Events drains the same, and says so once."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from storage import kube_events as queued
from storage.database import Database, open_database
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration.desk import bot_granted_for_the_test
from tests.integration.forwarder import Forwarder, kubeconfig_through
from workflows.config import GpuopsConfig
from workflows.engine.kube_events import KubeEventSender
from workflows.kube.gateway import KubeGateway

CHANNEL = "C0GPUOPS"
EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
# evpdb: a budget that keeps blocking halts the run after 4 seconds, its node cordoned.
BLOCKED_HALTS = {"evpdb": {"drain_timeout": "4s", "pdb_timeout_action": "wait"}}
CONFIG = GpuopsConfig.model_validate({
    "pools": {name: {"kind": "serving", "approvers": ["U0BOB"], "windows": "always", "max_unavailable": 1,
                     "min_ready_gpus": 0, "drain_timeout": "30s", "validate_timeout": "10s",
                     **BLOCKED_HALTS.get(name, {})}
              for name in ("ev", "evdeny", "evpdb")},
    "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"]},
               "names": {"U0ALICE": "alice", "U0BOB": "bob"}},
})


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


@pytest.fixture
def runtime(cluster, tmp_path: Path) -> Iterator[Runtime]:
    runtime = build_runtime(CONFIG, kubeconfig=str(cluster.kubeconfig), context="admin",
                            database=tmp_path / "gpuops.db")
    yield runtime
    runtime.close()


def gpu(runtime: Runtime, who: str, text: str):
    return dispatch(text, actor=runtime.config.actor(who), services=runtime.services(), now=h.now(),
                    channel=CHANNEL)


@contextmanager
def sender_running(kubeconfig: Path, db_path: Path, *, user: str) -> Iterator[KubeEventSender]:
    """The Lease holder's sender, as `user`, on its own thread and database connection."""
    gateway = KubeGateway.connect(kubeconfig=kubeconfig, context=user)
    stop, ready = threading.Event(), threading.Event()
    made: list[KubeEventSender] = []

    def body() -> None:
        db = open_database(db_path)
        try:
            made.append(KubeEventSender(db=db, gateway=gateway))
            ready.set()
            made[0].run(stop, gate=lambda: True, every=0.1)
        finally:
            db.close()

    thread = threading.Thread(target=body, name="events-sender", daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield made[0]
    finally:
        stop.set()
        thread.join(30)
        gateway.close()


def drain_as_bot(runtime: Runtime, cluster, pool: str, user: str, *, halts: bool = False) -> tuple[str, str]:
    """alice asks for the pool's first node, bob approves, the engine drains it as `user`
    until `drain done` (or until it halts); the run and the request."""
    node = f"{pool}-01"
    installer = cluster.installer()
    wait_until(lambda: advertised(h.node(installer, node)) > 0, timeout=60, what=f"{node} to advertise its GPUs")
    wait_until(lambda: len([p for p in h.workload_pods(installer, pool, "llm") if h.running_ready(p)]) == 2,
               timeout=60, what="both llm pods to run")
    wait_until(lambda: (inv := runtime.fleet.fleet(h.now()).nodes.get(node)) is not None  # type: ignore[attr-defined]
               and inv.advertised_gpus > 0, timeout=60, what="the bot's fleet cache to see the node")
    asked = gpu(runtime, "U0ALICE", f'/gpu drain {node} for 30m "kernel patch"')
    assert asked.ok, asked
    request_id = asked.title.split()[1]
    request = runtime.services().requests.get(request_id)  # type: ignore[union-attr]
    assert gpu(runtime, "U0BOB", f"/gpu approve {request.id} {request.short_hash}").ok
    run = runtime.services().runs.start(request.id, dry_run=False, now=h.now(),  # type: ignore[union-attr]
                                        actor=runtime.config.actor("U0ALICE"))
    db = runtime.database.get()
    # As `gpuops run` builds it: approvers named as the configuration names them.
    settings = dataclasses.replace(h.FAST, people=runtime.config.names)
    with h.EngineThread(cluster.kubeconfig, db.path, user=user, identity="gpuops-0", settings=settings):
        if halts:
            finished = h.wait_run(db, run.id, timeout=120)
            assert finished.state == "failed"
            return run.id, request.id
        wait_until(lambda: any(s.kind == "hold" and s.state == "running"
                               for s in runtime.services().runs.get(run.id).steps),  # type: ignore[union-attr]
                   timeout=90, what=f"{node} to be held")
        assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
        finished = h.wait_run(db, run.id, timeout=120)
    assert finished.state == "succeeded", finished.halted_reason
    return run.id, request.id


def fleet_of(pool: str, *, pdb_min_available: int | None = None) -> fl.FleetSpec:
    return fl.FleetSpec(name=pool, system_nodes=0, pools=(fl.PoolSpec(name=pool, kind="serving", nodes=1),),
                        workloads=(fl.WorkloadSpec(name="llm", namespace=pool, node=f"{pool}-01", replicas=2,
                                                   pdb_min_available=pdb_min_available),))


def events_of(installer, run_id: str) -> list[dict[str, Any]]:
    return installer.call("GET", EVENTS, query=[("labelSelector", f"gpuops.io/run={run_id}")]).get("items", [])


def all_sent(db: Database) -> bool:
    return not db.query("SELECT id FROM kube_events WHERE given_up = 0 AND sent_count < count")


def test_a_drain_tells_the_node_what_was_done_to_it_for_which_approved_request_and_window(
        fleet, cluster, runtime, as_bot):
    fleet(fleet_of("ev"))
    installer = cluster.installer()
    db = runtime.database.get()

    with sender_running(cluster.kubeconfig, db.path, user=as_bot) as sender:
        run_id, request_id = drain_as_bot(runtime, cluster, "ev", as_bot)
        wait_until(lambda: all_sent(db), timeout=30, what="every Event to be sent")
        assert sender.state == "flowing"

    on_node = [e for e in events_of(installer, run_id)
               if (e["regarding"]["kind"], e["regarding"]["name"]) == ("Node", "ev-01")]
    by_reason = {e["reason"]: e for e in on_node}
    assert set(by_reason) == {"WaveStarted", "Cordoned", "EvictionStarted", "PodEvicted", "Drained", "HoldEnded",
                              "NodeValidated", "Uncordoned"}
    assert len(on_node) == len(by_reason)  # one Event per reason: repeats are series
    for event in on_node:
        assert event["reportingController"] == "gpuops" and event["reportingInstance"] == "gpuops-0"
        assert event["type"] == "Normal" and event["regarding"]["uid"] == "ev-01"
    cordoned = by_reason["Cordoned"]["note"]
    assert cordoned.startswith("Cordoned by gpuops. ")
    assert f"Run {run_id} of request {request_id} (drain, pool ev), approved by bob, window " in cordoned
    # Two pods evicted from the node: one Event, counted twice.
    assert by_reason["PodEvicted"]["series"]["count"] == 2
    assert "series" not in by_reason["Cordoned"]
    # `kubectl describe node` finds them through the core Events API, by the node.
    core = installer.call("GET", "/api/v1/namespaces/default/events",
                          query=[("fieldSelector", "involvedObject.kind=Node,involvedObject.name=ev-01,"
                                                   "involvedObject.uid=ev-01")]).get("items", [])
    assert {e["reason"] for e in core} >= {"Cordoned", "Uncordoned"}


def an_event(run_id: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{node}.gpuops-{run_id}", "namespace": "default",
                         "labels": {"gpuops.io/run": run_id}},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "gpuops",
            "reportingInstance": "gpuops-0", "action": "evict", "reason": "EvictionBlocked", "type": "Warning",
            "note": "A PodDisruptionBudget blocks an eviction", "regarding": {"apiVersion": "v1", "kind": "Node",
                                                                              "name": node, "uid": node}}


def queue_event(db: Database, run_id: str, node: str, at: dt.datetime) -> None:
    with db.transaction():
        queued.queue_kube_event(db, key=f"{run_id}/Node/{node}/EvictionBlocked", cluster=None, namespace="default",
                                name=f"{node}.gpuops-{run_id}", body=an_event(run_id, node), at=at)


def test_a_repeat_after_its_event_was_sent_patches_the_events_series(cluster, db, as_bot):
    gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context=as_bot)
    sender = KubeEventSender(db=db, gateway=gateway)
    try:
        for at in (h.now(), h.now()):
            queue_event(db, "run-series", "gpu-77", at)
            assert sender.send_due() == 1

        (event,) = events_of(cluster.installer(), "run-series")
        assert event["series"]["count"] == 2 and event["note"] == "A PodDisruptionBudget blocks an eviction"
        assert sender.state == "flowing"
    finally:
        gateway.close()


def test_a_bot_without_the_grant_on_events_drains_the_same_and_says_so_once(fleet, cluster, runtime, as_bot, caplog):
    fleet(fleet_of("evdeny"))
    installer = cluster.installer()
    installer.delete({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": "gpuops-event-recorder"}})
    gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context=as_bot)
    wait_until(lambda: not gateway.may("create", "events", group="events.k8s.io", namespace="default"),
               timeout=30, what="the grant on Events to be gone")
    gateway.close()
    db = runtime.database.get()

    with caplog.at_level(logging.INFO, logger="gpuops.events"), \
            sender_running(cluster.kubeconfig, db.path, user=as_bot) as sender:
        run_id, _ = drain_as_bot(runtime, cluster, "evdeny", as_bot)  # succeeded: asserted inside
        wait_until(lambda: all_sent(db), timeout=30, what="every Event to be tried")
        assert sender.state == "refused"

    tried = db.query("SELECT given_up FROM kube_events")
    assert len(tried) > 2 and all(row["given_up"] == 1 for row in tried)
    refused = [r for r in caplog.records if r.name == "gpuops.events" and "refuses" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert events_of(installer, run_id) == []


def test_a_budget_that_keeps_blocking_is_a_warning_on_the_node_and_so_is_the_halt_it_leads_to(
        fleet, cluster, runtime, as_bot):
    fleet(fleet_of("evpdb", pdb_min_available=2))  # both pods must stay: no eviction is allowed
    installer = cluster.installer()
    db = runtime.database.get()

    with sender_running(cluster.kubeconfig, db.path, user=as_bot):
        run_id, request_id = drain_as_bot(runtime, cluster, "evpdb", as_bot, halts=True)
        wait_until(lambda: all_sent(db), timeout=30, what="every Event to be sent")

    on_node = {e["reason"]: e for e in events_of(installer, run_id) if e["regarding"]["name"] == "evpdb-01"}
    assert {"Cordoned", "EvictionStarted", "EvictionBlocked", "Halted"} <= set(on_node)
    assert "Uncordoned" not in on_node  # the halted run leaves its node cordoned
    assert (on_node["EvictionBlocked"]["type"], on_node["Halted"]["type"]) == ("Warning", "Warning")
    assert on_node["Halted"]["note"].startswith("Run halted here: ")
    assert f"Run {run_id} of request {request_id}" in on_node["Halted"]["note"]


def test_an_events_api_that_does_not_answer_is_said_once_and_its_events_are_sent_when_it_answers_again(
        cluster, db, tmp_path, caplog):
    server = urlparse(cluster.plane.server)
    forwarder = Forwarder((server.hostname, server.port)).start()
    gateway = KubeGateway.connect(kubeconfig=kubeconfig_through(cluster.kubeconfig, forwarder, tmp_path),
                                  context="admin")
    clock = {"now": h.now()}
    sender = KubeEventSender(db=db, gateway=gateway, clock=lambda: clock["now"])
    try:
        forwarder.cut()
        with caplog.at_level(logging.INFO, logger="gpuops.events"):
            for node in ("gpu-81", "gpu-82", "gpu-83"):
                queue_event(db, "run-lost", node, clock["now"])
            assert sender.send_due() == 0
            assert sender.state == "unreachable"
            assert sender.send_due() == 0  # nothing is due before its retry
            forwarder.restore()
            clock["now"] += dt.timedelta(seconds=5)
            assert sender.send_due() == 3

        told = [r.getMessage() for r in caplog.records if r.name == "gpuops.events"]
        assert len(told) == 2 and "does not answer" in told[0] and "sent again" in told[1]
        assert sorted(e["regarding"]["name"] for e in events_of(cluster.installer(), "run-lost")) == [
            "gpu-81", "gpu-82", "gpu-83"]
    finally:
        gateway.close()
        forwarder.cut()
