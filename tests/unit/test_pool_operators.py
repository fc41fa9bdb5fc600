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
    assert not refused.ok and "needs the operator role for pool train-a" in (refused.summary or ""), refused.summary
    # A member of the team's user group is one of its operators too.
    assert run(services, "U0GRACE", "drain gpu-b-02 for 1h psu", now, groups=("S0SERVE",)).ok


def test_the_fleets_operators_keep_every_pool_but_one_that_says_otherwise(services, now):
    assert run(services, "U0ALICE", "drain gpu-a-01 for 1h psu", now).ok
    refused = run(services, "U0ALICE", "drain gpu-b-01 for 1h psu", now)
    assert not refused.ok and "needs the operator role for pool serve-b" in (refused.summary or ""), refused.summary
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
