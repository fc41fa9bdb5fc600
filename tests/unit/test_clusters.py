"""Several clusters behind one `/gpu`: the `clusters:` configuration, which cluster a
command addresses (`--cluster`, `cluster/name`, the channel's cluster, the home cluster),
every cluster's line first in `/gpu status`, a cluster that does not answer reported as
such without holding up the others, and changes refused outside the home cluster. The
real clusters, one of them unreachable, are in tests/integration/test_clusters_control_plane.py."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.clusters import Clusters
from commands.reply import Reply
from commands.services import Services
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.fleet.clusters import ClusterUnreachable, Reach
from workflows.fleet.summary import Fleet

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
POOL = {"kind": "training", "windows": "always", "approvals": {"drain": 0}}
WHOLE = {
    "clusters": {
        "east": {"home": True, "channels": ["C0EAST"], "pools": {"train-e": POOL}},
        "west": {"kubeconfig": "/etc/gpuops/west.kubeconfig", "context": "west-admin", "channels": ["C0WEST"],
                 "cluster": {"pool_label": "node-group"}, "pools": {"train-w": POOL}},
    },
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]}, "names": {"U0ALICE": "alice"}},
}
CONFIG = GpuopsConfig.model_validate(WHOLE)


@dataclass
class Source:
    """A cluster as the directory reads it: a fleet (or why there is none yet) and its reach."""

    name: str
    value: Fleet | None
    state: str = "up"
    since: dt.datetime | None = None
    reason: str | None = None

    def reach(self, now: dt.datetime) -> Reach:
        return Reach(cluster=self.name, state=self.state, since=self.since, reason=self.reason)  # type: ignore[arg-type]

    def fleet(self, now: dt.datetime) -> Fleet:
        if self.value is None:
            raise ClusterUnreachable(self.name, since=self.since if self.state == "connecting" else None,
                                     reason=self.reason)
        return self.value


@pytest.fixture
def fleets(make):
    east = [make.node(f"gpu-e-{n:02d}", pool="train-e") for n in (1, 2)]
    west = [make.node(f"gpu-w-{n:02d}", pool="train-w", ready=n != 3) for n in (1, 2, 3)]
    return (make.fleet(east, [p for n in east for p in make.operands(n.name)]),
            make.fleet(west, [p for n in west for p in make.operands(n.name)]))


def home_services(config: GpuopsConfig, sources: dict[str, Source], db, *, delivery: str | None = None) -> Services:
    """The home cluster's services as the bot builds them (Runtime.services), with every
    other cluster's made on demand (Runtime.cluster_services), answering `delivery`."""

    def make(name: str, *, delivery: str | None = None) -> Services:
        made = Services.on_database(config=config.for_cluster(name), fleet=sources[name], database=db,
                                    delivery=delivery)
        made.cluster, made.clusters = name, directory
        return made

    directory = Clusters(config=config, sources=sources, make_services=make)
    return make(directory.home, delivery=delivery)


@pytest.fixture
def world(fleets, tmp_path: Path):
    """The home services, and west's source to turn down or away."""
    east, west = fleets
    west_source = Source("west", west)
    db = open_database(tmp_path / "gpuops.db")
    yield home_services(CONFIG, {"east": Source("east", east), "west": west_source}, db), west_source
    db.close()


def gpu(services: Services, text: str, *, who: str = "U0ALICE", channel: str | None = "C0OPS") -> Reply:
    return dispatch(text, actor=CONFIG.actor(who), services=services, now=NOW, channel=channel)


def table_of(reply: Reply, title: str) -> list[tuple[str, ...]]:
    return [tuple(row) for s in reply.sections if s.title == title and s.table for row in s.table.rows]


# ------------------------------------------------------------------ configuration


def test_each_cluster_has_its_own_pools_and_settings_and_the_rest_is_shared():
    east, west = CONFIG.for_cluster("east"), CONFIG.for_cluster("west")

    assert CONFIG.home_cluster == "east"
    assert list(east.pools) == ["train-e"] and list(west.pools) == ["train-w"]
    assert west.inventory_settings().pool_label_key == "node-group"
    assert east.inventory_settings().pool_label_key == "gpuops.io/pool"
    assert west.access == east.access == CONFIG.access
    assert CONFIG.cluster_of_channel("C0WEST") == "west" and CONFIG.cluster_of_channel("C0OPS") is None


@pytest.mark.parametrize(("change", "says"), [
    ({"clusters": {"east": {"home": True}, "west": {"home": True, "kubeconfig": "/k"}}},
     "exactly one cluster must be the home cluster"),
    ({"clusters": {"east": {}, "west": {"kubeconfig": "/k"}}}, "exactly one cluster must be the home cluster"),
    ({"clusters": {"east": {"home": True}, "west": {}}}, "west: a cluster other than the home cluster needs its "
                                                          "kubeconfig"),
    ({"clusters": {"East_1": {"home": True}}}, "cluster name 'East_1'"),
    ({"clusters": {"east": {"home": True, "channels": ["C1"]}, "west": {"kubeconfig": "/k", "channels": ["C1"]}}},
     "channel C1 defaults to both east and west"),
    ({"clusters": {"east": {"home": True}, "west": {"in_cluster": True}}}, "in_cluster is for the home cluster"),
    ({"clusters": {"east": {"home": True, "in_cluster": True, "kubeconfig": "/k"}}},
     "give in_cluster or a kubeconfig/context, not both"),
    ({"clusters": {"east": {"home": True}}, "pools": {"train-a": POOL}},
     "with clusters: set, pools go under each cluster (clusters.<name>.pools)"),
    ({"clusters": {"east": {"home": True, "pools": {"a/b": POOL}}}}, "has a '/'"),
])
def test_a_bad_clusters_configuration_stops_the_start_naming_the_key_and_why(tmp_path, change, says):
    import yaml

    path = tmp_path / "gpuops.yaml"
    path.write_text(yaml.safe_dump(change))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert says in str(err.value)


# ------------------------------------------------------------------ reading any cluster


def test_status_shows_every_cluster_first_home_first_then_the_home_clusters_detail(world):
    services, _ = world

    reply = gpu(services, "/gpu status")

    assert reply.ok and reply.title == "GPU fleet status · east"
    assert reply.sections[0].title == "Clusters"
    rows = table_of(reply, "Clusters")
    assert [row[0] for row in rows] == ["east (home)", "west"]
    assert rows[1][1:4] == ("up", "2/3", "24/24")  # west: one node not Ready
    assert "train-e" in render_text(reply) and "train-w" not in render_text(reply)


@pytest.mark.parametrize("text", ["/gpu status --cluster west", "/gpu status --cluster=west", "/gpu status west/train-w"])
def test_a_command_names_its_cluster_with_the_flag_or_a_prefix(world, text):
    services, _ = world

    reply = gpu(services, text)

    assert reply.ok and reply.title.endswith("· west")
    assert "train-w" in render_text(reply) and "train-e" not in render_text(reply)


def test_a_node_of_another_cluster_is_read_by_its_prefixed_name_and_the_channel_picks_the_cluster(world):
    services, _ = world

    assert gpu(services, "/gpu node west/gpu-w-03").title == "GPU node gpu-w-03 · west"
    assert gpu(services, "/gpu node gpu-w-03", channel="C0WEST").title == "GPU node gpu-w-03 · west"
    # In the home cluster's channel (or any other) the same name is not a node there.
    refused = gpu(services, "/gpu node gpu-w-03", channel="C0EAST")
    assert not refused.ok and "gpu-w-03" in render_text(refused)
    # A named cluster wins over the channel's.
    assert gpu(services, "/gpu status --cluster east", channel="C0WEST").title.endswith("· east")


@pytest.mark.parametrize(("text", "says"), [
    ("/gpu status --cluster north", "there is no cluster 'north'; gpuops serves east, west"),
    ("/gpu status --cluster", "--cluster needs a cluster name"),
    ("/gpu node --cluster east west/gpu-w-01", "names two clusters (east and west)"),
])
def test_a_bad_cluster_name_is_refused_with_the_clusters_there_are(world, text, says):
    services, _ = world

    reply = gpu(services, text)

    assert not reply.ok and says in render_text(reply)


def test_one_cluster_gpuops_refuses_a_cluster_flag_and_leaves_slashes_alone(make, tmp_path):
    fleet = make.fleet([make.node("gpu-a-01", pool="train-a")], [])
    services = Services(config=GpuopsConfig(), fleet=StaticFleet(fleet))

    refused = dispatch("/gpu status --cluster west", actor=CONFIG.actor("U0ALICE"), services=services, now=NOW)
    missing = dispatch("/gpu node west/gpu-a-01", actor=CONFIG.actor("U0ALICE"), services=services, now=NOW)

    assert not refused.ok and "serves one cluster" in render_text(refused)
    assert not missing.ok and "west/gpu-a-01" in render_text(missing)


# ------------------------------------------------------------------ a cluster that does not answer


def test_a_cluster_never_reached_is_said_so_and_the_others_answer(world):
    services, west = world
    west.value, west.state = None, "connecting"
    west.since, west.reason = NOW - dt.timedelta(minutes=5), "connection refused"

    status = gpu(services, "/gpu status")
    direct = gpu(services, "/gpu status --cluster west")
    node = gpu(services, "/gpu node west/gpu-w-01")

    assert status.ok and table_of(status, "Clusters")[1][1:] == (
        "not reached yet for 5m (connection refused)", "-", "-", "-")
    assert "train-e" in render_text(status)
    # Asked for that cluster: the clusters' lines, and why there is nothing more.
    assert direct.summary == "cluster west has not answered since 2026-12-02 09:55 UTC: connection refused"
    assert [row[0] for row in table_of(direct, "Clusters")] == ["east (home)", "west"]
    assert not node.ok and node.title == "Cluster not reached · west"
    assert "connection refused" in render_text(node)


def test_since_when_a_cluster_never_reached_was_tried_is_said_in_the_display_zone(fleets, tmp_path: Path):
    east, west = fleets
    config = GpuopsConfig.model_validate({**WHOLE, "display": {"timezone": "Europe/Berlin"}})
    west_source = Source("west", None, state="connecting", since=NOW - dt.timedelta(minutes=5),
                         reason="connection refused")
    with open_database(tmp_path / "gpuops.db") as db:
        services = home_services(config, {"east": Source("east", east), "west": west_source}, db)
        direct = dispatch("/gpu status --cluster west", actor=config.actor("U0ALICE"), services=services, now=NOW)
        node = dispatch("/gpu node west/gpu-w-01", actor=config.actor("U0ALICE"), services=services, now=NOW)

    assert direct.summary == "cluster west has not answered since 2026-12-02 10:55 CET: connection refused"
    assert "since 2026-12-02 10:55 CET" in render_text(node) and "UTC" not in render_text(node)


def test_a_cluster_that_went_down_shows_its_last_seen_fleet_marked_as_such(world):
    services, west = world
    west.state, west.since = "down", NOW - dt.timedelta(minutes=2)

    row = table_of(gpu(services, "/gpu status"), "Clusters")[1]

    assert row[1] == "DOWN for 2m; figures as last seen" and row[2] == "2/3"


# ------------------------------------------------------------------ the handover and requests


def test_the_handover_names_a_cluster_that_does_not_answer_first_and_the_others_in_a_line(world, make):
    from workflows.handover.building import build_checklist
    from workflows.handover.rotations import RotationConfig

    services, west = world
    rotation = RotationConfig.model_validate({
        "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "UTC",
        "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]}]})
    assert services.clusters is not None

    def checklist():
        return build_checklist(fleet=services.fleet.fleet(NOW), requests=[], runs_in_flight=[], previous=None,
                               rotation=rotation, shift=rotation.current_shift(NOW), now=NOW,
                               clusters=services.clusters.others(NOW))  # type: ignore[union-attr]

    up = [i for i in checklist().for_information if i.kind == "cluster"]
    assert [(i.subject, i.text, i.command) for i in up] == [(
        "west", "cluster west: 2/3 GPU nodes Ready, 24/24 GPUs advertised; findings: 1 warning",
        "/gpu status --cluster west")]

    west.state, west.since = "down", NOW - dt.timedelta(minutes=42)
    first = checklist().needs_action[0]
    assert (first.kind, first.severity, first.subject) == ("cluster", "warning", "west")
    assert first.text == ("cluster west does not answer for 42m; when last seen, 2/3 GPU nodes were Ready. "
                          "Its findings are not checked while it is away")


def test_a_request_keeps_the_cluster_it_changes_and_its_card_says_so(world):
    services, _ = world

    asked = gpu(services, '/gpu drain gpu-e-01 "disk swap"')

    assert asked.ok, render_text(asked)
    assert services.requests is not None
    request = services.requests.get(asked.title.split()[1])
    assert request.cluster == "east"
    shown = gpu(services, f"/gpu request {request.id}")
    assert ("Cluster", "east") in [(f.label, f.value) for s in shown.sections for f in s.facts]
    assert services.database is not None
    created = services.database.execute(
        "SELECT detail FROM audit WHERE action = 'request.created'").fetchone()[0]
    assert json.loads(created)["cluster"] == "east"


# ------------------------------------------------------------------ changes in every cluster

EVERYWHERE = GpuopsConfig.model_validate({
    "clusters": {
        "east": {"home": True, "pools": {"train-e": {**POOL, "approvals": {"drain": 1}, "approvers": ["U0CAROL"]}}},
        "west": {"kubeconfig": "/k", "channels": ["C0WEST"],
                 "pools": {"train-w": {**POOL, "approvals": {"drain": 1}, "approvers": ["U0BOB"], "max_unavailable": 2}}},
    },
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]},
               "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol", "U0ERIN": "erin"}},
})


@pytest.fixture
def everywhere(fleets, tmp_path: Path):
    """Both clusters with their own pools' approvers, on one database."""
    east, west = fleets
    db = open_database(tmp_path / "gpuops.db")
    yield home_services(EVERYWHERE, {"east": Source("east", east), "west": Source("west", west)}, db)
    db.close()


def run(services: Services, who: str, text: str, *, channel: str = "C0OPS") -> Reply:
    return dispatch(text, actor=EVERYWHERE.actor(who), services=services, now=NOW, channel=channel)


def test_a_drain_in_another_cluster_is_that_clusters_request_under_its_pools_rules(everywhere):
    asked = run(everywhere, "U0ALICE", '/gpu drain west/gpu-w-01 "disk swap"')

    assert asked.ok and asked.title.endswith("· west"), render_text(asked)
    request_id = asked.title.split()[1]
    assert everywhere.requests is not None
    request = everywhere.requests.get(request_id)
    assert (request.cluster, request.pool, request.state) == ("west", "train-w", "pending")
    # An approver of east's pools is none of west's; the request's id takes the command
    # to its cluster whatever channel it is typed in.
    carol = run(everywhere, "U0CAROL", f"/gpu approve {request_id} {request.short_hash}")
    assert not carol.ok and carol.title.endswith("· west")
    bob = run(everywhere, "U0BOB", f"/gpu approve {request_id} {request.short_hash}", channel="C0EAST")
    assert bob.ok and everywhere.requests.get(request_id).state == "approved", render_text(bob)
    wrong = run(everywhere, "U0BOB", f"/gpu request {request_id} --cluster east")
    assert not wrong.ok and f"{request_id} is about cluster west, not east" in render_text(wrong)


def test_a_slack_delivery_run_again_files_nothing_in_another_cluster_either(fleets, tmp_path: Path):
    """A replica died after filing a drain of another cluster and before answering: the
    survivor runs the delivery again and answers with that request, in that cluster."""
    east, west = fleets
    db = open_database(tmp_path / "gpuops.db")
    sources = {"east": Source("east", east), "west": Source("west", west)}
    try:
        first = run(home_services(EVERYWHERE, sources, db, delivery="/gpu:U0ALICE:3001.1"), "U0ALICE",
                    '/gpu drain west/gpu-w-01 "disk swap"')
        again = run(home_services(EVERYWHERE, sources, db, delivery="/gpu:U0ALICE:3001.1"), "U0ALICE",
                    '/gpu drain west/gpu-w-01 "disk swap"')
        other = run(home_services(EVERYWHERE, sources, db, delivery="/gpu:U0ALICE:3002.1"), "U0ALICE",
                    '/gpu drain west/gpu-w-02 "fan"')
    finally:
        rows = [(r["id"], r["cluster"]) for r in db.query("SELECT id, cluster FROM requests ORDER BY created_at")]
        db.close()

    assert first.ok and again.ok and other.ok, (render_text(first), render_text(again))
    assert again.title.split()[1] == first.title.split()[1] and again.title.endswith("· west")
    assert [cluster for _, cluster in rows] == ["west", "west"], rows  # the drain once, and the other one


def test_an_approve_click_on_another_clusters_request_shows_its_card_as_the_typed_command_does(everywhere):
    from bot.clicks import Click, press
    from bot.intents import encode_value

    asked = run(everywhere, "U0ALICE", '/gpu drain west/gpu-w-01 "disk swap"')
    request = everywhere.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    value = encode_value(request.id, request.plan_hash)

    carol = press(Click(action="approve", value=value, actor=EVERYWHERE.actor("U0CAROL"), now=NOW), everywhere)
    bob = press(Click(action="approve", value=value, actor=EVERYWHERE.actor("U0BOB"), now=NOW), everywhere)

    assert not carol.ok and bob.ok, (carol.notice, bob.notice)
    assert bob.card == run(everywhere, "U0BOB", f"/gpu request {request.id}")
    assert bob.card is not None and bob.card.title.endswith("· west")


def test_each_cluster_lists_its_own_requests(everywhere):
    east = run(everywhere, "U0ALICE", '/gpu drain gpu-e-01 "east one"')
    west = run(everywhere, "U0ALICE", '/gpu drain gpu-w-01 "west one"', channel="C0WEST")
    assert east.ok and west.ok

    listed_east = render_text(run(everywhere, "U0ALICE", "/gpu requests"))
    listed_west = render_text(run(everywhere, "U0ALICE", "/gpu requests --cluster west"))

    assert east.title.split()[1] in listed_east and west.title.split()[1] not in listed_east
    assert west.title.split()[1] in listed_west and east.title.split()[1] not in listed_west


def test_each_clusters_service_asks_for_and_expires_only_its_own_pending_requests(make, tmp_path: Path):
    """Both clusters call a pool `train`, which needs an approval: an admin sees each request
    once, under its own cluster; the sweep of one cluster expires none of another's."""
    def fleet(prefix: str) -> Fleet:
        nodes = [make.node(f"gpu-{prefix}-{n:02d}", pool="train") for n in (1, 2)]
        return make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])

    pool = {**POOL, "approvals": {"drain": 1}}
    config = GpuopsConfig.model_validate({**TWINS.model_dump(include={"access"}), "clusters": {
        "east": {"home": True, "pools": {"train": pool}},
        "west": {"kubeconfig": "/k", "channels": ["C0WEST"], "pools": {"train": pool}}}})
    db = open_database(tmp_path / "gpuops.db")
    home = home_services(config, {"east": Source("east", fleet("e")), "west": Source("west", fleet("w"))}, db)
    try:
        east, west = (dispatch(text, actor=config.actor("U0ALICE"), services=home, now=NOW, channel=channel)
                      for text, channel in (('/gpu drain gpu-e-01 "east one"', "C0OPS"),
                                            ('/gpu drain gpu-w-01 "west one"', "C0WEST")))
        east_id, west_id = east.title.split()[1], west.title.split()[1]
        assert home.clusters is not None and home.requests is not None
        west_services = home.clusters.services_for("west", home)
        assert west_services.requests is not None
        admin = config.actor("U0ERIN")

        assert [v.id for v in home.requests.waiting_for(admin, now=NOW)] == [east_id]
        assert [v.id for v in west_services.requests.waiting_for(admin, now=NOW)] == [west_id]

        late = NOW + dt.timedelta(days=30)
        assert [v.id for v in home.requests.expire_due(late)] == [east_id]
        assert home.requests.get(west_id).state == "pending"
        assert [v.id for v in west_services.requests.expire_due(late)] == [west_id]
    finally:
        db.close()


def test_a_freeze_of_one_cluster_holds_that_cluster_alone(everywhere):
    frozen = run(everywhere, "U0ERIN", "/gpu freeze cluster until 18:00 incident 9 --cluster west")
    assert frozen.ok, render_text(frozen)

    west = run(everywhere, "U0ALICE", '/gpu drain west/gpu-w-01 "disk swap"')
    east = run(everywhere, "U0ALICE", '/gpu drain gpu-e-01 "disk swap"')

    assert not west.ok and "cluster west is frozen by erin" in render_text(west)
    assert "--cluster west" in render_text(west)  # how to lift it
    assert east.ok, render_text(east)
    assert "Cluster west is frozen" in render_text(run(everywhere, "U0ALICE", "/gpu status --cluster west"))
    assert "frozen" not in render_text(run(everywhere, "U0ALICE", "/gpu status"))


def test_the_scheduler_starts_each_clusters_runs_by_its_own_rules(everywhere):
    from bot.scheduler import start_window_runs
    from storage import runs as stored_runs

    asked = run(everywhere, "U0ALICE", '/gpu drain west/gpu-w-01 "disk swap"')
    request_id = asked.title.split()[1]
    assert everywhere.requests is not None
    request = everywhere.requests.get(request_id)
    assert run(everywhere, "U0BOB", f"/gpu approve {request_id} {request.short_hash}").ok

    class Host:
        config, fleet, clusters, signals, gateway = EVERYWHERE.for_cluster("east"), None, everywhere.clusters, None, None

        class database:  # noqa: N801 - the host's per-thread database, one connection here
            @staticmethod
            def get():
                return everywhere.database

        def notify(self) -> None:
            pass

        def roles_in(self, config):
            return None  # the configuration alone

    start_window_runs(Host(), NOW)  # type: ignore[arg-type]

    assert everywhere.database is not None
    started = [r for r in stored_runs.unfinished(everywhere.database) if r.request_id == request_id]
    assert len(started) == 1


# ------------------------------------------------------------------ pools of the same name

TWINS = GpuopsConfig.model_validate({
    "clusters": {
        "east": {"home": True, "pools": {"train": POOL}},
        "west": {"kubeconfig": "/k", "channels": ["C0WEST"], "pools": {"train": POOL}},
    },
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]}, "names": {"U0ALICE": "alice"}},
})


@pytest.fixture
def twins(make, tmp_path: Path):
    """Two clusters that both call a pool `train` (node names differ), on one database."""
    def fleet(prefix: str) -> Fleet:
        nodes = [make.node(f"gpu-{prefix}-{n:02d}", pool="train") for n in (1, 2)]
        return make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])

    db = open_database(tmp_path / "gpuops.db")
    yield home_services(TWINS, {"east": Source("east", fleet("e")), "west": Source("west", fleet("w"))}, db)
    db.close()


def test_a_pool_name_two_clusters_share_shows_each_clusters_runs_and_drains_only(twins):
    def started(text: str, channel: str) -> tuple[str, str]:
        asked = dispatch(text, actor=TWINS.actor("U0ALICE"), services=twins, now=NOW, channel=channel)
        assert asked.ok, render_text(asked)
        request_id = asked.title.split()[1]
        assert twins.runs is not None
        return request_id, str(twins.runs.start(request_id, dry_run=False, now=NOW).id)

    east_request, east_run = started('/gpu drain gpu-e-01 "east disk"', "C0OPS")
    west_request, west_run = started('/gpu drain gpu-w-01 "west disk"', "C0WEST")

    def say(text: str, who: str = "U0ALICE") -> str:
        reply = dispatch(text, actor=TWINS.actor(who), services=twins, now=NOW, channel="C0OPS")
        assert reply.ok, render_text(reply)
        return render_text(reply)

    # The pool's status names its own cluster's run, not the other's of the same pool name.
    east_pool, west_pool = say("/gpu status train"), say("/gpu status west/train")
    assert east_run in east_pool and west_run not in east_pool
    assert west_run in west_pool and east_run not in west_pool
    # The drains table of the status: each cluster's drain requests.
    east_status, west_status = say("/gpu status"), say("/gpu status --cluster west")
    assert east_request in east_status and west_request not in east_status
    assert west_request in west_status and east_request not in west_status
    # A freeze of east's pool holds east's run in flight, and names no run of west's.
    frozen = say("/gpu freeze train until 18:00 incident 9", who="U0ERIN")
    assert east_run in frozen and west_run not in frozen
    # `/gpu runs`-wide readers still see both: the console's exit warning and the handover.
    assert twins.runs is not None
    assert {str(v.id) for v in twins.runs.unfinished(every_cluster=True)} == {east_run, west_run}
    from workflows.handover.service import HandoverService

    assert twins.database is not None and twins.clusters is not None
    handover = HandoverService(twins.database, TWINS.for_cluster("east"), others=twins.clusters.others)
    assert sorted((r.run_id, r.pool) for r in handover.runs_in_flight()) == sorted(
        [(east_run, "east/train"), (west_run, "west/train")])
