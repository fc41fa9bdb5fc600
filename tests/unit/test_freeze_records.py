"""What lifting a freeze leaves behind and says, and which freeze holds a run or a new
request: the lifted row (who, by which name, when, why), the audit row, the engine woken
and nothing posted, the refusals word for word (who may lift, nothing to lift, a freeze
that covers the pool from the cluster, one already lifted or over), each cluster's own
freezes on a database clusters share, and a freeze over at its `until` to the second.
The commands around it are in test_freezes.py; the audit of setting in test_freeze_audit.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from storage import audit
from storage.database import Database, open_database
from tests.unit.test_freezes import CONFIG, ERIN, NOW
from workflows.access import AccessDenied, Actor, Role, UserId
from workflows.pools import freezes
from workflows.pools import messages as say
from workflows.pools.freezes import FreezeRefused, FreezeService

BERLIN = ZoneInfo("Europe/Berlin")
HOUR = dt.timedelta(hours=1)
# Someone the configuration names no one and who is no Slack user: the command line's.
ROOT = Actor(user_id=UserId("cli:root"), name="root", roles=frozenset({Role.ADMIN}), via="cli")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "gpuops.db")
    yield database
    database.close()


class Wakes:
    """The engine's wake-up, counted."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def service(db: Database, *, cluster: str | None = None, wake: Wakes | None = None,
            zone: dt.tzinfo = dt.timezone.utc) -> FreezeService:
    """One cluster's freezes as `Services.on_database` builds them, on `db`."""
    return FreezeService(db, pools=CONFIG.pools, names=CONFIG.names, wake=wake, cluster=cluster, zone=zone)


def freeze(on: FreezeService, target: str, *, hours: float, reason: str = "incident 4711",
           let_running_finish: bool = False) -> freezes.Freeze:
    return on.set(ERIN, target=target, until=NOW + dt.timedelta(hours=hours), reason=reason,
                  let_running_finish=let_running_finish, now=NOW).freeze


def refusal(lifting: FreezeService, target: str, *, now: dt.datetime = NOW) -> str:
    with pytest.raises(FreezeRefused) as refused:
        lifting.lift(ERIN, target=target, reason="done", now=now)
    return str(refused.value)


def lifts(db: Database) -> list[audit.AuditEntry]:
    return [e for e in audit.recent(db, 100) if e.action == "freeze.lifted"]


# ------------------------------------------------------------------ lifting


def test_a_lifted_freeze_ends_at_once_saying_who_lifted_it_when_and_why_and_wakes_the_engine(db):
    wakes = Wakes()
    freezes_here = service(db, wake=wakes)
    frozen = freeze(freezes_here, "serve-b", hours=8, reason="launch day")
    at = NOW + HOUR

    lifted = freezes_here.lift(ERIN, target="serve-b", reason="  launch went fine  ", now=at)

    assert (lifted.id, lifted.target, lifted.until, lifted.reason, lifted.set_by_name) == (
        frozen.id, "serve-b", NOW + 8 * HOUR, "launch day", "erin")
    assert (lifted.lifted_at, lifted.lifted_by, lifted.lifted_by_name, lifted.lift_reason, lifted.replaced_by) == (
        at, "U0ERIN", "erin", "launch went fine", None)
    assert freezes_here.in_force(at) == [] and freezes.holding_requests(db, pool="serve-b", now=at) is None
    # Setting woke the engine once, lifting once more: the runs it held go on at once.
    assert wakes.count == 2
    entry = audit.recent(db, 1)[0]
    assert (entry.action, entry.actor, entry.k8s_identity, entry.target, entry.at) == (
        "freeze.lifted", "U0ERIN", None, "serve-b", at)
    assert (entry.before, entry.after, entry.detail) == (
        {"id": frozen.id, "target": "serve-b", "until": "2026-12-02T18:00:00+00:00", "reason": "launch day",
         "let_running_finish": False, "set_by": "U0ERIN"},
        None, {"freeze": frozen.id, "reason": "launch went fine"})
    # Lifting posts nothing itself: the engine it woke tells each held run's thread.
    assert db.query("SELECT id FROM outbox") == []


@pytest.mark.parametrize(("actor", "named"), [
    (ROOT, "root"),  # the command line's user, by the name it gave
    (Actor(user_id=UserId("U0ZED"), name="Erin (display name)", roles=frozenset({Role.ADMIN})), "<@U0ZED>"),
])
def test_someone_the_configuration_does_not_name_is_recorded_by_who_they_really_are(db, actor, named):
    freezes_here = service(db)
    freeze(freezes_here, "train-a", hours=2)
    lifted = freezes_here.lift(actor, target="train-a", reason="", now=NOW)
    assert (lifted.lifted_by, lifted.lifted_by_name) == (actor.user_id, named)


@pytest.mark.parametrize(("who", "says"), [
    ("U0ALICE", "alice has operator, viewer"), ("U0BOB", "bob has approver, viewer"), ("U0DAVE", "dave has viewer")])
def test_only_an_admin_may_lift_a_freeze_and_the_refusal_says_so_and_lifts_nothing(db, who, says):
    wakes = Wakes()
    freezes_here = service(db, wake=wakes)
    frozen = freeze(freezes_here, "cluster", hours=2)
    with pytest.raises(AccessDenied) as denied:
        freezes_here.lift(CONFIG.actor(who), target="cluster", reason="let me", now=NOW)
    assert str(denied.value) == f"Lifting a freeze needs the admin role; {says}"
    assert freezes_here.in_force(NOW) == [frozen] and lifts(db) == [] and wakes.count == 1


def test_unfreezing_the_cluster_when_only_pools_are_frozen_names_those_pools_to_lift_instead(db):
    freezes_here = service(db)
    freeze(freezes_here, "train-a", hours=2)
    freeze(freezes_here, "serve-b", hours=3)
    assert refusal(freezes_here, "cluster") == say.freeze_nothing_to_lift(
        "cluster", cluster_freeze=None, frozen_pools=["serve-b", "train-a"])
    assert refusal(freezes_here, "cluster").startswith(
        "The cluster is not frozen; pools with a freeze of their own: serve-b and train-a")
    assert len(freezes_here.in_force(NOW)) == 2 and lifts(db) == []


def test_unfreezing_a_pool_the_cluster_covers_names_the_cluster_freeze_ending_in_the_display_zone(db):
    in_berlin = service(db, zone=BERLIN)
    cluster_freeze = freeze(in_berlin, "cluster", hours=23, reason="DC power work", let_running_finish=True)

    said = refusal(in_berlin, "train-a")

    assert said == say.freeze_nothing_to_lift(
        "train-a", cluster_freeze=freezes.freeze_sentence(cluster_freeze, zone=BERLIN), frozen_pools=[])
    assert "until 2026-12-03 10:00 CET: DC power work" in said
    assert in_berlin.in_force(NOW) == [cluster_freeze] and lifts(db) == []


def test_a_freeze_already_lifted_or_over_or_an_unknown_pool_is_refused_and_nothing_is_recorded(db):
    wakes = Wakes()
    freezes_here = service(db, wake=wakes)
    freeze(freezes_here, "serve-b", hours=1)
    freeze(freezes_here, "train-a", hours=2)
    freezes_here.lift(ERIN, target="serve-b", reason="done", now=NOW)
    woken = wakes.count

    assert refusal(freezes_here, "serve-b") == say.freeze_nothing_to_lift(
        "serve-b", cluster_freeze=None, frozen_pools=[])
    assert refusal(freezes_here, "serve-b") == "Pool serve-b is not frozen; nothing to lift (`/gpu freezes` lists them)."
    # Over at its `until` to the second: there is nothing left to lift.
    assert refusal(freezes_here, "train-a", now=NOW + 2 * HOUR) == say.freeze_nothing_to_lift(
        "train-a", cluster_freeze=None, frozen_pools=[])
    assert refusal(freezes_here, "train-b") == say.freeze_unknown_target(
        "train-b", closest=["train-a"], pools=["serve-b", "train-a"])
    assert [e.target for e in lifts(db)] == ["serve-b"] and wakes.count == woken


def test_each_cluster_lifts_its_own_freeze_of_a_pool_name_both_have_and_sees_only_its_own(db):
    east, west = service(db, cluster="east"), service(db, cluster="west")
    east_freeze = freeze(east, "serve-b", hours=2, reason="east launch")
    west_freeze = freeze(west, "serve-b", hours=3, reason="west launch")

    lifted = east.lift(ERIN, target="serve-b", reason="east done", now=NOW)

    assert (lifted.id, lifted.cluster, lifted.lift_reason) == (east_freeze.id, "east", "east done")
    assert east.in_force(NOW) == [] and west.in_force(NOW) == [west_freeze]
    assert freezes.holding_requests(db, pool="serve-b", now=NOW, cluster="west") == west_freeze
    assert freezes.holding_requests(db, pool="serve-b", now=NOW, cluster="east") is None
    # West's cluster is not frozen; its pool freeze is the one to lift, east's lifted one is no more.
    assert refusal(west, "cluster") == say.freeze_nothing_to_lift("cluster", cluster_freeze=None,
                                                                  frozen_pools=["serve-b"])
    assert refusal(east, "serve-b") == say.freeze_nothing_to_lift("serve-b", cluster_freeze=None, frozen_pools=[])


# ------------------------------------------------------------------ what holds a run or a request


@pytest.mark.parametrize(("pool_hours", "cluster_hours", "named"), [
    (2, 8, "cluster"),   # the cluster's ends last
    (8, 2, "serve-b"),   # the pool's own ends last
])
def test_of_two_freezes_holding_a_pool_the_one_ending_last_is_named_so_people_know_when_it_opens(
        db, pool_hours, cluster_hours, named):
    freezes_here = service(db)
    freeze(freezes_here, "serve-b", hours=pool_hours)
    freeze(freezes_here, "cluster", hours=cluster_hours)
    for holding in (freezes.holding_requests(db, pool="serve-b", now=NOW),
                    freezes.holding_run(db, pool="serve-b", started=False, now=NOW),
                    freezes.holding_run(db, pool="serve-b", started=True, now=NOW)):
        assert holding is not None and holding.target == named


def test_a_freeze_letting_running_runs_finish_holds_only_runs_that_had_not_started(db):
    freezes_here = service(db)
    freeze(freezes_here, "cluster", hours=8, reason="holidays", let_running_finish=True)
    hard_stop = freeze(freezes_here, "serve-b", hours=2, reason="hard stop")

    held = freezes.holding_run(db, pool="serve-b", started=False, now=NOW)
    assert held is not None and (held.target, held.reason) == ("cluster", "holidays")
    assert freezes.holding_run(db, pool="serve-b", started=True, now=NOW) == hard_stop
    # train-a has only the cluster's freeze: a run under way goes on, a new one waits.
    assert freezes.holding_run(db, pool="train-a", started=True, now=NOW) is None
    assert freezes.holding_run(db, pool="train-a", started=False, now=NOW) == held
    # Once the pool's hard stop is over, a started run of serve-b goes on too.
    assert freezes.holding_run(db, pool="serve-b", started=True, now=NOW + 2 * HOUR) is None


def test_a_freeze_holds_until_the_second_before_its_end_and_not_at_it(db):
    frozen = freeze(service(db), "train-a", hours=2)
    last_second = frozen.until - dt.timedelta(seconds=1)
    assert freezes.holding_run(db, pool="train-a", started=True, now=last_second) == frozen
    assert freezes.holding_requests(db, pool="train-a", now=last_second) == frozen
    assert freezes.holding_run(db, pool="train-a", started=True, now=frozen.until) is None
    assert freezes.holding_requests(db, pool="train-a", now=frozen.until) is None


def test_a_freeze_of_another_cluster_holds_none_of_this_clusters_runs_of_a_pool_of_the_same_name(db):
    west_pool = freeze(service(db, cluster="west"), "serve-b", hours=2)
    west_whole = freeze(service(db, cluster="west"), "cluster", hours=1)

    for started in (False, True):
        assert freezes.holding_run(db, pool="serve-b", started=started, now=NOW, cluster="east") is None
        assert freezes.holding_run(db, pool="serve-b", started=started, now=NOW, cluster="west") == west_pool
    assert freezes.holding_run(db, pool="train-a", started=True, now=NOW, cluster="west") == west_whole
    assert freezes.holding_run(db, pool="train-a", started=True, now=NOW, cluster="east") is None
    assert freezes.holding_requests(db, pool="train-a", now=NOW, cluster="east") is None
