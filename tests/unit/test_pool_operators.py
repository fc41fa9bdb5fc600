"""Operators per pool (`pools.<name>.operators`, `global_operators`): teams sharing a
cluster operate their own pools only, through the one dispatcher on a real SQLite request
service and a fleet built from plain values, with `/gpu status <pool>` naming who may."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.access import Role
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
NOW_TEXT = "2026-12-02 10:00:00"
# Fleet operator alice; the serving team (frank, and the user group S0SERVE) owns serve-b,
# which the fleet's operators may not touch; train-a stays everyone's.
CONFIG = {
    "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 2},
              "serve-b": {"kind": "serving", "windows": "always", "max_unavailable": "50%",
                          "operators": ["U0FRANK", "group:S0SERVE"], "global_operators": False}},
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"], "U0DAVE": ["viewer"]},
               "names": {"U0ALICE": "alice", "U0ERIN": "erin", "U0DAVE": "dave", "U0FRANK": "frank"}},
}


@pytest.fixture
def now():
    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        yield dt.datetime.now(UTC)


@pytest.fixture
def services(make, tmp_path: Path):
    nodes = [make.node(f"gpu-a-{n:02d}", pool="train-a") for n in range(1, 3)]
    nodes += [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in range(1, 3)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    built = Services.on_database(config=GpuopsConfig.model_validate(CONFIG),
                                 fleet=StaticFleet(make.fleet(nodes, pods)), database=open_database(tmp_path / "g.db"))
    yield built
    built.database.close()  # type: ignore[union-attr]


def run(services: Services, who: str, text: str, now: dt.datetime, *, groups: tuple[str, ...] = ()) -> Reply:
    return dispatch(text, actor=services.config.actor(who, groups=groups), services=services, now=now,
                    channel="C0OPS")


def test_a_pools_own_operator_operates_that_pool_and_no_other(services, now):
    assert run(services, "U0FRANK", "drain gpu-b-01 for 1h psu", now).ok
    refused = run(services, "U0FRANK", "drain gpu-a-01 for 1h psu", now)
    assert not refused.ok and refused.summary == (
        "Requesting a drain needs the operator role for pool train-a; frank has no role. "
        "Who may act on pool train-a: the fleet's operators and admins."), refused.summary
    # A member of the team's user group is one of its operators too.
    assert run(services, "U0GRACE", "drain gpu-b-02 for 1h psu", now, groups=("S0SERVE",)).ok


def test_the_fleets_operators_keep_every_pool_but_one_that_says_otherwise(services, now):
    assert run(services, "U0ALICE", "drain gpu-a-01 for 1h psu", now).ok
    refused = run(services, "U0ALICE", "drain gpu-b-01 for 1h psu", now)
    assert not refused.ok and refused.summary == (
        "Requesting a drain needs the operator role for pool serve-b; alice has viewer. "
        "Who may act on pool serve-b: frank, S0SERVE (user group) and admins."), refused.summary
    # Admins operate every pool; the fleet operator still reads everything.
    assert run(services, "U0ERIN", "drain gpu-b-01 for 1h psu", now).ok
    assert run(services, "U0ALICE", "status serve-b", now).ok
    alice = services.config.actor("U0ALICE")
    assert alice.has(Role.VIEWER) and alice.has(Role.OPERATOR, pool="train-a")
    assert not alice.has(Role.OPERATOR, pool="serve-b") and not alice.has(Role.OPERATOR)


def test_without_pools_of_their_own_the_fleets_operators_operate_everything_as_before(make, tmp_path):
    config = GpuopsConfig.model_validate({**CONFIG, "pools": {**CONFIG["pools"], "serve-b": {
        **CONFIG["pools"]["serve-b"], "global_operators": True}}})
    alice = config.actor("U0ALICE")
    assert alice.has(Role.OPERATOR) and alice.has(Role.OPERATOR, pool="serve-b")
    assert config.actor("U0FRANK").has(Role.OPERATOR, pool="serve-b")
    assert not config.actor("U0FRANK").has(Role.OPERATOR, pool="train-a")


def test_status_of_a_pool_names_who_operates_it(services, now):
    facts = {f.label: f.value for f in run(services, "U0DAVE", "status serve-b", now).sections[0].facts}
    assert facts["Operators"] == "frank, S0SERVE (user group) only (not the fleet's operators)"
    facts = {f.label: f.value for f in run(services, "U0DAVE", "status train-a", now).sections[0].facts}
    assert facts["Operators"] == "the fleet's operators"


def test_the_user_groups_named_as_a_pools_operators_are_among_those_the_bot_reads():
    from bot.identity import configured_groups

    assert "S0SERVE" in configured_groups(GpuopsConfig.model_validate(CONFIG))


@pytest.fixture
def serving(make, tmp_path: Path):
    """The same fleet and people, serve-b needing no approval for a drain."""
    config = {**CONFIG, "pools": {**CONFIG["pools"], "serve-b": {**CONFIG["pools"]["serve-b"], "approvals": {"drain": 0}}}}
    nodes = [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in range(1, 3)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    built = Services.on_database(config=GpuopsConfig.model_validate(config),
                                 fleet=StaticFleet(make.fleet(nodes, pods)), database=open_database(tmp_path / "g.db"))
    yield built
    built.database.close()  # type: ignore[union-attr]


def _running_drain(services: Services, now: dt.datetime) -> tuple[str, str]:
    """frank's drain of gpu-b-01 (serve-b needs no approval for drains), its run started:
    (request id, run id)."""
    asked = run(services, "U0FRANK", "drain gpu-b-01 for 1h psu", now)
    assert asked.ok, asked.summary
    request_id = next(fact.value for section in asked.sections for fact in section.facts if fact.label == "Request")
    started = services.runs.start(request_id, dry_run=False, now=now,  # type: ignore[union-attr]
                                  actor=services.config.actor("U0FRANK"))
    return request_id, started.id


# Every action that takes the operator role on a run of the pool or a node in it: the
# words alice types, and the sentence her refusal starts with.
ON_THE_POOL = {
    "pause": ("pause {run}", "A run being paused needs the operator role for pool serve-b"),
    "abort": ("abort {run}", "A run being aborted needs the operator role for pool serve-b"),
    "resume": ("resume {run}", "A run being resumed needs the operator role for pool serve-b"),
    "continue": ("continue {run}", "Continuing a halted run needs the operator role for pool serve-b"),
    "migrate confirm": ("migrate confirm {run}",
                        "Only an operator of pool serve-b or an admin can say the host driver is gone for run {run}"),
    "drain done": ("drain done {request}", "Only an operator of pool serve-b or an admin can end the window of {request} early"),
    "note": ("note gpu-b-02 PSU swapped", "Writing a note on a node needs the operator role for pool serve-b"),
}


@pytest.mark.parametrize("action", sorted(ON_THE_POOL))
def test_every_action_on_a_pool_with_its_own_operators_refuses_the_fleets_operator_naming_the_pool_and_who_may(
        serving, now, action):
    request_id, run_id = _running_drain(serving, now)
    words, refusal = ON_THE_POOL[action]
    before = serving.runs.request_audit(request_id)  # type: ignore[union-attr]

    refused = run(serving, "U0ALICE", words.format(run=run_id, request=request_id), now)

    assert not refused.ok and (refused.summary or "").startswith(refusal.format(run=run_id, request=request_id))
    assert (refused.summary or "").endswith("Who may act on pool serve-b: frank, S0SERVE (user group) and admins.")
    assert serving.runs.request_audit(request_id) == before  # type: ignore[union-attr]
    assert serving.runs.get(run_id).state == "pending"  # type: ignore[union-attr]


def test_the_pools_own_operator_pauses_and_ends_its_drain_early(serving, now):
    request_id, run_id = _running_drain(serving, now)

    assert run(serving, "U0FRANK", f"pause {run_id}", now).ok
    assert run(serving, "U0FRANK", f"drain done {request_id}", now).ok
    assert run(serving, "U0FRANK", "note gpu-b-02 PSU swapped", now).ok
    assert {"run.paused", "run.released"} <= {e.action for e in serving.runs.request_audit(request_id)}  # type: ignore[union-attr]


def test_a_requester_no_longer_among_the_pools_operators_may_not_end_its_drain_early_nor_hold_it_longer(
        serving, now):
    request_id, _ = _running_drain(serving, now)
    # The serving team's list no longer names frank, who now operates train-a.
    pools = serving.config.pools
    serving.config = serving.config.model_copy(update={"pools": {
        "serve-b": pools["serve-b"].model_copy(update={"operators": ("group:S0SERVE",)}),
        "train-a": pools["train-a"].model_copy(update={"operators": ("U0FRANK",)})}})

    before = serving.runs.request_audit(request_id)  # type: ignore[union-attr]

    done = run(serving, "U0FRANK", f"drain done {request_id}", now)
    longer = run(serving, "U0FRANK", f"drain extend {request_id} 30m", now)

    assert not done.ok and done.summary == (
        f"Only an operator of pool serve-b or an admin can end the window of {request_id} early. "
        "Who may act on pool serve-b: S0SERVE (user group) and admins."), done.summary
    assert not longer.ok and longer.summary == (
        f"Holding {request_id} longer needs the operator role for pool serve-b; frank has no role. "
        "Who may act on pool serve-b: S0SERVE (user group) and admins."), longer.summary
    assert serving.runs.request_audit(request_id) == before  # type: ignore[union-attr]


# Two clusters that both have a pool called "serve": in west it is the serving team's alone.
CLUSTERS = {
    "clusters": {
        "east": {"home": True, "pools": {"serve": {"kind": "serving", "windows": "always"}}},
        "west": {"kubeconfig": "/etc/gpuops/west.kubeconfig", "pools": {"serve": {
            "kind": "serving", "windows": "always", "operators": ["group:S0WEST"], "global_operators": False}}},
    },
    "access": {"users": {"U0ALICE": ["operator"]}},
}


def test_operators_are_per_cluster_as_approvers_are():
    config = GpuopsConfig.model_validate(CLUSTERS)
    east, west = config.for_cluster("east"), config.for_cluster("west")

    assert east.actor("U0ALICE").has(Role.OPERATOR, pool="serve")
    assert not west.actor("U0ALICE").has(Role.OPERATOR, pool="serve")
    assert west.actor("U0GRACE", groups=("S0WEST",)).has(Role.OPERATOR, pool="serve")
    assert not east.actor("U0GRACE", groups=("S0WEST",)).has(Role.OPERATOR, pool="serve")


def test_a_clusters_operator_groups_are_among_those_the_bot_reads():
    from bot.identity import configured_groups

    assert "S0WEST" in configured_groups(GpuopsConfig.model_validate(CLUSTERS))


def test_a_request_form_submitted_with_several_clusters_reads_the_pools_operators_of_the_home_cluster(make, tmp_path):
    """A form's submission is run as its command with the person as the bot's directory
    reads them (the gpuops-wide configuration, which has no pools of its own with
    `clusters:`): the home cluster's exclusive pool still refuses the fleet's operator."""
    from commands.clusters import Clusters
    from commands.drain import request_drain
    from commands.registry import REGISTRY, invoke
    from workflows.drain.plan import DrainAsk

    config = GpuopsConfig.model_validate({**CLUSTERS, "clusters": {**CLUSTERS["clusters"], "east": {
        "home": True, "pools": {"serve": {"kind": "serving", "windows": "always", "operators": ["U0FRANK"],
                                          "global_operators": False},
                                "train": {"kind": "training", "windows": "always"}}}}})
    nodes = [make.node(f"gpu-e-{n:02d}", pool="serve") for n in (1, 2)]
    fleet = StaticFleet(make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)]))
    db = open_database(tmp_path / "g.db")

    def services_of(name: str, *, delivery: str | None = None) -> Services:
        made = Services.on_database(config=config.for_cluster(name), fleet=fleet, database=db, delivery=delivery)
        made.cluster, made.clusters = name, directory
        return made

    directory = Clusters(config=config, sources={"east": fleet, "west": fleet},  # type: ignore[dict-item]
                         make_services=services_of)
    ask = DrainAsk(targets=("gpu-e-01",), duration=dt.timedelta(hours=1), reason="psu")

    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        now = dt.datetime.now(UTC)
        refused = invoke(REGISTRY.commands[("drain",)], lambda call: request_drain(call, ask),
                         actor=config.actor("U0ALICE"), services=services_of("east"), now=now)
        allowed = invoke(REGISTRY.commands[("drain",)], lambda call: request_drain(call, ask),
                         actor=config.actor("U0FRANK"), services=services_of("east"), now=now)
    db.close()

    assert not refused.ok and (refused.summary or "").startswith(
        "Requesting a drain needs the operator role for pool serve; U0ALICE has viewer."), refused.summary
    assert allowed.ok, allowed.summary
