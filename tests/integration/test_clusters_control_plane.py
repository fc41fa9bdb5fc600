"""One gpuops, two real clusters: the session's control plane is east, the home cluster
(the engine's Lease), and a second control plane of its own (its own ports and process
group, its own fleet) is west, reached through Toxiproxy so the test can take it off the
network and give it back.

`/gpu status` shows both clusters first; west going away is reported as down, with its
last seen figures, and holds nothing up: a drain in east asks, is approved, runs under the
Lease in east, is held and given back while west does not answer. A drain in west is
west's request, approved by west's pool's approver and run in west by west's engine under
the same Lease, touching nothing in east. A west that was never reached when gpuops
started joins as soon as it answers."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot.cli import _serve_health
from bot.health import Readiness
from bot.metrics import Metrics
from bot.scheduler import clear_stale_marks
from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from commands.reply import Reply
from testenv import fleet as fl
from testenv.environment import Environment
from testenv.install import wait_until
from testenv.toxiproxy import Proxy, Toxiproxy, kubeconfig_via
from tests.integration import engine_harness as h
from tests.integration.desk import bot_rbac_granted, grant_bot_rbac
from workflows.config import GpuopsConfig
from workflows.kube.labels import ANNOTATION_CORDONED_BY


CHANNEL = "C0GPUOPS"
BOT_NAMESPACE = "gpuops"  # the bot's own namespace in deploy/rbac.yaml
EAST = fl.FleetSpec(name="east", system_nodes=0, pools=(fl.PoolSpec(name="serve", kind="serving", nodes=2),))
WEST = fl.FleetSpec(name="west", system_nodes=0, pools=(fl.PoolSpec(name="train", kind="training", nodes=3),))


@pytest.fixture(scope="module")
def west(tmp_path_factory, gpu_operator_crds) -> Iterator[Environment]:
    """A second control plane with a fleet of its own."""
    env = Environment(folder=tmp_path_factory.mktemp("west"))
    env.start()
    try:
        env.install_crds()
        env.apply_fleet(WEST)
        grant_bot_rbac(env.installer())  # gpuops' identity there: the grants of an install
        yield env
    finally:
        env.stop()


@pytest.fixture
def west_proxy(west: Environment, tmp_path: Path) -> Iterator[tuple[Toxiproxy, Proxy, Path]]:
    """Toxiproxy in front of west's API server, and a kubeconfig that goes through it."""
    server = yaml.safe_load(west.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with Toxiproxy(folder=tmp_path / "toxiproxy") as toxiproxy:
        proxy = toxiproxy.create_proxy("west", server.removeprefix("https://"))
        yield toxiproxy, proxy, kubeconfig_via(west.kubeconfig, proxy.server, tmp_path / "west.kubeconfig")


def config(east_kubeconfig: Path, west_kubeconfig: Path) -> GpuopsConfig:
    pool = {"approvers": ["U0BOB"], "approvals": {"drain": 1}, "windows": "always", "max_unavailable": 1,
            "min_ready_gpus": 0,
            "drain_timeout": "20s", "validate_timeout": "5s"}
    return GpuopsConfig.model_validate({
        "clusters": {
            "east": {"home": True, "kubeconfig": str(east_kubeconfig), "context": "bot",
                     "pools": {"serve": {"kind": "serving", **pool}}},
            "west": {"kubeconfig": str(west_kubeconfig), "context": "bot", "channels": ["C0WEST"],
                     "pools": {"train": {"kind": "training", **pool}}},
        },
        "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"]},
                   "names": {"U0ALICE": "alice", "U0BOB": "bob"}},
    })


@pytest.fixture
def start(cluster, tmp_path: Path, monkeypatch) -> Iterator:
    """gpuops as the bot's ServiceAccount in both clusters, with the grants of
    deploy/rbac.yaml; its Lease in its own namespace in east, the home cluster."""
    runtimes: list[Runtime] = []
    with bot_rbac_granted(cluster.installer()):
        monkeypatch.setenv("POD_NAMESPACE", BOT_NAMESPACE)

        def build(west_kubeconfig: Path) -> Runtime:
            runtime = build_runtime(config(cluster.kubeconfig, west_kubeconfig), kubeconfig=None, context=None,
                                    database=tmp_path / "gpuops.db")
            runtimes.append(runtime)
            return runtime

        try:
            yield build
        finally:
            for runtime in runtimes:
                runtime.close()


def gpu(runtime: Runtime, who: str, text: str, *, channel: str = CHANNEL) -> Reply:
    return dispatch(text, actor=runtime.config.actor(who), services=runtime.services(), now=h.now(),
                    channel=channel)


def scrape(metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(metrics.base_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def cluster_row(runtime: Runtime, name: str) -> tuple[str, ...]:
    reply = gpu(runtime, "U0ALICE", "/gpu status")
    assert reply.ok and reply.sections[0].title == "Clusters"
    table = reply.sections[0].table
    assert table is not None
    return next(tuple(row) for row in table.rows if row[0].split()[0] == name)


def test_both_clusters_are_read_and_a_drain_runs_at_home_while_the_other_is_unreachable(
        fleet, cluster, west_proxy, start):
    toxiproxy, proxy, west_kubeconfig = west_proxy
    fleet(EAST)
    runtime = start(west_kubeconfig)
    installer = cluster.installer()

    wait_until(lambda: cluster_row(runtime, "west")[1:3] == ("up", "3/3"), timeout=90,
               what="west's three nodes Ready in /gpu status")
    wait_until(lambda: cluster_row(runtime, "east")[2] == "2/2", timeout=90, what="east's two nodes Ready")
    west_pool = gpu(runtime, "U0ALICE", "/gpu status west/train")
    assert west_pool.ok and west_pool.title == "GPU pool train · west"

    health, metrics = _serve_health(runtime, Metrics(), health_port=0, metrics_port=0)
    try:
        assert scrape(metrics)[("gpuops_cluster_up", (("cluster", "west"),))] == 1
        toxiproxy.set_enabled(proxy, False)  # west is off the network
        wait_until(lambda: cluster_row(runtime, "west")[1].startswith("DOWN"), timeout=60,
                   what="west to be reported down")
        assert cluster_row(runtime, "west")[2] == "3/3"  # as last seen
        # The health port says so, and stays ready: east answers.
        with urllib.request.urlopen(health.base_url + "/readyz", timeout=5) as ready:
            assert ready.status == 200
            assert "cluster west: not answering for" in ready.read().decode()
        samples = scrape(metrics)
        assert samples[("gpuops_cluster_up", (("cluster", "west"),))] == 0
        assert samples[("gpuops_cluster_up", (("cluster", "east"),))] == 1
        assert samples[("gpuops_cluster_down_seconds", (("cluster", "west"),))] > 0
        assert samples[("gpuops_watch_cache_synced", (("cluster", "east"), ("resource", "nodes")))] == 1
        assert not [k for k in samples if k[0] == "gpuops_findings" and ("cluster", "west") in k[1]]
    finally:
        health.stop()
        metrics.stop()

    # A drain in east, end to end, under the Lease in east, while west does not answer.
    runtime.start_background("replica-east", slack=None)
    wait_until(runtime.leading, timeout=30, what="the engine's Lease in east")
    run_id = drain(runtime, installer, '/gpu drain serve-01 "disk swap"', "serve-01")
    finished = h.wait_run(runtime.database.get(), run_id)

    assert finished.state == "succeeded", finished.halted_reason
    assert not h.unschedulable(installer, "serve-01")
    assert cluster_row(runtime, "west")[1].startswith("DOWN")  # still away all along
    leases = installer.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{BOT_NAMESPACE}/leases")["items"]
    assert any(lease["spec"].get("holderIdentity") == "replica-east" for lease in leases)

    toxiproxy.set_enabled(proxy, True)
    wait_until(lambda: cluster_row(runtime, "west")[1] == "up", timeout=90, what="west to answer again")


def test_a_cluster_down_when_gpuops_starts_joins_once_it_answers(fleet, west_proxy, start):
    toxiproxy, proxy, west_kubeconfig = west_proxy
    fleet(EAST)
    toxiproxy.set_enabled(proxy, False)
    runtime = start(west_kubeconfig)  # does not wait for west

    row = cluster_row(runtime, "west")
    assert row[1].startswith("not reached yet") and row[2:] == ("-", "-", "-")
    node = gpu(runtime, "U0ALICE", "/gpu node west/train-01")
    assert not node.ok and node.title == "Cluster not reached · west"
    east = gpu(runtime, "U0ALICE", "/gpu status serve")
    assert east.ok and east.title == "GPU pool serve · east"
    assert runtime.clusters is not None
    ready, lines = Readiness(others={"west": runtime.clusters.sources["west"]}).check()
    assert ready and lines[0].startswith("cluster west: not reached yet, trying for"), lines

    toxiproxy.set_enabled(proxy, True)
    wait_until(lambda: cluster_row(runtime, "west")[1:3] == ("up", "3/3"), timeout=90, what="west to join")
    assert gpu(runtime, "U0ALICE", "/gpu node west/train-01").ok


def drain(runtime: Runtime, installer, text: str, node: str, *, approver: str = "U0BOB") -> str:
    """Ask for a drain, approve it, wait until its node is held, end the hold and wait for
    the run to finish; the run's id."""
    asked = gpu(runtime, "U0ALICE", text)
    assert asked.ok, asked
    request_id = asked.title.split()[1]
    services = runtime.services()
    assert services.requests is not None and services.runs is not None
    request = services.requests.get(request_id)
    approved = gpu(runtime, approver, f"/gpu approve {request.id} {request.short_hash}")
    assert approved.ok, approved
    wait_until(lambda: services.runs.for_request(request_id), timeout=30, what="the run to start at once")
    run_id = services.runs.for_request(request_id)[0].id
    wait_until(lambda: h.unschedulable(installer, node), timeout=60, what=f"{node} cordoned")
    wait_until(lambda: any(s.kind == "hold" and s.state == "running" for s in services.runs.get(run_id).steps),
               timeout=60, what=f"{node} held")
    assert gpu(runtime, "U0ALICE", f"/gpu drain done {request_id}").ok
    return run_id


def test_a_drain_in_the_other_cluster_runs_there_by_its_own_engine_under_the_home_lease(
        fleet, cluster, west, west_proxy, start):
    _, _, west_kubeconfig = west_proxy
    fleet(EAST)
    runtime = start(west_kubeconfig)
    wait_until(lambda: cluster_row(runtime, "west")[1:3] == ("up", "3/3"), timeout=90, what="west's nodes Ready")
    runtime.start_background("replica-east", slack=None)
    wait_until(runtime.leading, timeout=30, what="the engine's Lease in east")
    assert runtime.leadership is not None
    assert {w.name for w in runtime.leadership.workers} >= {"engine", "engine-west"}

    run_id = drain(runtime, west.installer(), '/gpu drain west/train-01 "disk swap"', "train-01")
    finished = h.wait_run(runtime.database.get(), run_id)

    assert finished.state == "succeeded", finished.halted_reason
    assert not h.unschedulable(west.installer(), "train-01")
    request = runtime.services().requests.get(finished.request_id)  # type: ignore[union-attr]
    assert (request.cluster, request.pool) == ("west", "train")
    east = cluster.installer()
    assert not h.unschedulable(east, "serve-01") and not h.unschedulable(east, "serve-02")

    # A node of west left cordoned by a run that finished, then uncordoned by a person:
    # the mark gpuops left is stale and goes, through west's API (east has no train-02).
    mark = json.dumps({"run": run_id, "by": "gpuops", "prior_unschedulable": False, "at": h.now().isoformat()})
    west.installer().call("PATCH", "/api/v1/nodes/train-02", body={"metadata": {"annotations": {
        ANNOTATION_CORDONED_BY: mark}}}, content_type="application/merge-patch+json")
    west_fleet = runtime.clusters.sources["west"]  # type: ignore[union-attr]
    wait_until(lambda: west_fleet.fleet(h.now()).nodes["train-02"].stale_mark_run == run_id,
               timeout=30, what="the bot to see train-02's stale mark in west")
    clear_stale_marks(runtime, h.now())  # type: ignore[arg-type]
    assert h.cordon_mark(west.installer(), "train-02") is None
