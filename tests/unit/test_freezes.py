"""Change freezes: `/gpu freeze`, `/gpu unfreeze` and `/gpu freezes` through the one
dispatcher on a real SQLite database, and what a freeze does to everything else: new
requests refused naming who froze what until when and why, runs refused a start, the
freeze first in `/gpu status`, App Home and the handover. The engine's side (a run in
flight stopping at its next node boundary) is tested on the real control plane
(tests/integration/test_freeze_control_plane.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from freezegun import freeze_time

from bot.home import home_view
from commands.catalog import dispatch
from commands.freezes import read_freeze_words
from commands.registry import UsageError
from commands.reply import Reply
from commands.services import Services
from storage import audit
from storage import freezes as stored_freezes
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunRefused
from workflows.handover.building import build_checklist
from workflows.handover.rotations import RotationConfig
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools import freezes
from workflows.requests.errors import RequestRefused

UTC = dt.timezone.utc
# Wednesday 2 December 2026, 11:00 in Berlin.
NOW_TEXT = "2026-12-02 10:00:00"
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
BERLIN_WINDOWS = [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}]
CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training", "windows": BERLIN_WINDOWS, "approvals": {"drain": 0, "upgrade": 0}},
              "serve-b": {"kind": "serving", "windows": "always", "approvals": {"drain": 0, "upgrade": 0}}},
    "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0DAVE": ["viewer"], "U0ERIN": ["admin"]},
               "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0DAVE": "dave", "U0ERIN": "erin"}},
})
ALICE, ERIN = CONFIG.actor("U0ALICE"), CONFIG.actor("U0ERIN")


@pytest.fixture
def services(make, tmp_path: Path):
    nodes = [make.node(f"gpu-a-{n:02d}", pool="train-a") for n in (1, 2)]
    nodes += [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in (1, 2)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    db = open_database(tmp_path / "gpuops.db")
    yield Services.on_database(config=CONFIG, fleet=StaticFleet(make.fleet(nodes, pods)), database=db)
    db.close()


def gpu(services: Services, who: str, text: str, now: dt.datetime = NOW) -> Reply:
    return dispatch(text, actor=CONFIG.actor(who), services=services, now=now, channel="C0OPS")


def test_a_freeze_asked_again_by_the_delivery_that_set_it_is_answered_with_that_freeze_not_set_twice(services):
    # The delivery run again by another replica: the one that set the freeze died before answering.
    same = Services.on_database(config=CONFIG, fleet=services.fleet, database=services.database,
                                delivery="/gpu:U0ERIN:1001.1")
    words = "freeze serve-b until 2026-12-03 09:00 incident 4711"
    first = gpu(same, "U0ERIN", words)
    again = gpu(same, "U0ERIN", words, NOW + dt.timedelta(seconds=15))

    assert first.ok and again.ok and again.summary == first.summary
    assert [f["target"] for f in services.database.query("SELECT target FROM freezes")] == ["serve-b"]
    actions = [r["action"] for r in services.database.query("SELECT action FROM audit")]
    assert actions.count("freeze.set") == 1 and "freeze.lifted" not in actions


def audit_actions(services: Services) -> list[str]:
    return [e.action for e in reversed(audit.recent(services.database, 100))]  # type: ignore[arg-type]


def freeze_rows(services: Services) -> list[dict]:
    return services.database.query("SELECT * FROM freezes")  # type: ignore[union-attr]


def plan(pool: str) -> Plan:
    node = NodeName(f"gpu-{pool[-1]}-01")
    return Plan(kind="drain", pool=pool, created_for="U0ALICE", summary=PlanSummary(),
                waves=(Wave(0, (node,), tuple(NodeStep(k, node, {}) for k in ("cordon", "hold", "uncordon"))),))


def submit(services: Services, pool: str, now: dt.datetime = NOW):
    return services.requests.submit(ALICE, kind="drain", pool=pool, targets=[f"gpu-{pool[-1]}-01"],  # type: ignore[union-attr]
                                    plan=plan(pool), window_start=None, window_end=None, reason="NIC swap", now=now)


# ------------------------------------------------------------------ the grammar


@pytest.mark.parametrize(("words", "until", "finish", "reason"), [
    # A pool's times are read in its windows' zone (Berlin: UTC+1 in December).
    ("train-a until sat 09:00 incident 4711", dt.datetime(2026, 12, 5, 8, 0, tzinfo=UTC), False, "incident 4711"),
    ("train-a until 17:30", dt.datetime(2026, 12, 2, 16, 30, tzinfo=UTC), False, ""),
    ("train-a until 09:00 kernel CVE", dt.datetime(2026, 12, 3, 8, 0, tzinfo=UTC), False, "kernel CVE"),
    # The cluster's in UTC, unless the time names a zone.
    ("cluster until tomorrow 09:00", dt.datetime(2026, 12, 3, 9, 0, tzinfo=UTC), False, ""),
    ("cluster until 2026-12-28 08:00 Europe/Berlin --let-running-finish holidays",
     dt.datetime(2026, 12, 28, 7, 0, tzinfo=UTC), True, "holidays"),
    ("serve-b --let-running-finish until 2026-12-05T02:00 launch", dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC), True,
     "launch"),
])
def test_freeze_words_read_the_drain_grammars_times_in_the_pools_zone(words, until, finish, reason):
    ask = read_freeze_words(words.split(), pools=CONFIG.pools, now=NOW)
    assert (ask.until, ask.let_running_finish, ask.reason) == (until, finish, reason)


@pytest.mark.parametrize(("text", "says"), [
    ("freeze", "Say what to freeze (`cluster` or a pool) and until when"),
    ("freeze train-a", "A freeze needs an end: `until <time>` after the target (nothing follows the target)"),
    ("freeze train-a for 2h", "A freeze needs an end: `until <time>` after the target (got 'for')"),
    ("freeze train-a until", "`until` needs a time"),
    ("freeze train-a until yesterday 09:00", "Cannot read the time 'yesterday 09:00'"),
    ("freeze train-a until 25:00", "Cannot read the time '25:00'"),
    ("freeze train-a until 2026-02-30 09:00", "Cannot read the time '2026-02-30 09:00'"),
    ("freeze train-a until 09:00 Mars/Olympus", "Mars/Olympus"),
    ("freeze train-a until 2026-12-01 09:00 oops", "2026-12-01 08:00 UTC is not in the future"),
    ("freeze train-a until today 10:30", "2026-12-02 09:30 UTC is not in the future"),
    ("freeze train-b until 09:00", "'train-b' is neither `cluster` nor a configured pool; pools: "
                                   "serve-b and train-a; did you mean train-a?"),
    ("unfreeze clustr", "'clustr' is neither `cluster` nor a configured pool; pools: serve-b and train-a; "
                        "did you mean cluster?"),
    ("freeze train-a until 09:00 --let-runs-finish", "Unknown option '--let-runs-finish'"),
])
def test_bad_freezes_get_a_sentence_saying_what_is_wrong_and_change_nothing(services, text, says):
    reply = gpu(services, "U0ERIN", text)
    assert not reply.ok
    assert says in (reply.summary or ""), reply.summary
    assert freeze_rows(services) == [] and audit_actions(services) == []


def test_only_admins_freeze_and_unfreeze_and_help_shows_the_commands_to_them_alone(services):
    for who in ("U0ALICE", "U0BOB", "U0DAVE"):
        refused = gpu(services, who, "freeze cluster until tomorrow 09:00 I am not an admin")
        assert not refused.ok and "needs the admin role" in (refused.summary or "")
        assert not gpu(services, who, "unfreeze cluster").ok
    assert freeze_rows(services) == [] and audit_actions(services) == []
    # Lower down too: the service fails closed without the dispatcher.
    with pytest.raises(Exception, match="needs the admin role"):
        services.freezes.set(ALICE, target="cluster", until=NOW + dt.timedelta(hours=1), reason="",  # type: ignore[union-attr]
                             let_running_finish=False, now=NOW)

    def listed(who: str) -> set[str]:
        table = gpu(services, who, "help").sections[0].table
        return {row[0].split()[1] for row in table.rows if row[0]}  # type: ignore[union-attr]

    assert {"freeze", "unfreeze", "freezes"} <= listed("U0ERIN")
    assert "freeze" not in listed("U0ALICE") and "unfreeze" not in listed("U0ALICE") and "freezes" in listed("U0DAVE")


# ------------------------------------------------------------------ storing, expiring, lifting


def test_a_freeze_is_audited_and_ends_by_itself_at_its_time_with_no_job_run(services):
    with freeze_time(NOW_TEXT) as clock:
        now = dt.datetime.now(UTC)
        reply = gpu(services, "U0ERIN", "freeze train-a until 13:00 incident 4711 (GPU XIDs)", now)
        assert reply.ok and reply.visibility == "in_channel", reply.summary
        assert reply.title == "Froze pool train-a"
        assert reply.summary == ("Pool train-a is frozen by erin until 2026-12-02 12:00 UTC: incident 4711 (GPU XIDs); "
                                 "no new requests, no run starts, runs stop at their next node boundary")
        entry = audit.recent(services.database, 1)[0]  # type: ignore[arg-type]
        assert (entry.action, entry.actor, entry.target) == ("freeze.set", "U0ERIN", "train-a")
        assert entry.after["reason"] == "incident 4711 (GPU XIDs)" and entry.before is None  # type: ignore[index]

        clock.move_to("2026-12-02 11:59:59")
        assert gpu(services, "U0DAVE", "freezes", dt.datetime.now(UTC)).title == "1 freeze in force"
        clock.move_to("2026-12-02 12:00:00")
        listed = gpu(services, "U0DAVE", "freezes", dt.datetime.now(UTC))
        assert listed.title == "No freeze in force"
        submit(services, "train-a", dt.datetime.now(UTC))  # accepted again
    assert audit_actions(services) == ["freeze.set", "request.created", "request.approved"]
    assert audit.verify(services.database).ok  # type: ignore[arg-type]


def test_freezing_a_frozen_pool_replaces_its_freeze_and_says_which(services):
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 first").ok
    second = gpu(services, "U0ERIN", "freeze serve-b until 18:00 --let-running-finish longer")
    assert second.ok
    assert second.sections[0].bullets[0].startswith("Replaces the freeze that was in force: Pool serve-b is frozen by "
                                                    "erin until 2026-12-02 12:00 UTC: first")
    in_force = services.freezes.in_force(NOW)  # type: ignore[union-attr]
    assert [(f.target, f.reason, f.let_running_finish) for f in in_force] == [("serve-b", "longer", True)]
    assert audit_actions(services) == ["freeze.set", "freeze.lifted", "freeze.set"]
    old = stored_freezes.get(services.database, id=stored_freezes.FreezeId(1))  # type: ignore[arg-type]
    assert old is not None and old.replaced_by == in_force[0].id and not old.in_force(NOW)


def test_unfreeze_lifts_at_once_is_audited_and_names_the_freeze_that_really_covers_a_pool(services):
    assert gpu(services, "U0ERIN", "freeze cluster until tomorrow 09:00 --let-running-finish DC power work").ok
    covered = gpu(services, "U0ERIN", "unfreeze train-a")
    assert not covered.ok
    assert covered.summary.startswith("Pool train-a has no freeze of its own; it is covered by the cluster's: ")
    assert "Lift that one with `/gpu unfreeze cluster`" in covered.summary
    assert not submit_refused_is_none(services, "train-a")

    lifted = gpu(services, "U0ERIN", "unfreeze cluster power work postponed")
    assert lifted.ok and lifted.title == "Lifted the cluster's freeze"
    assert lifted.summary.startswith("erin lifted the freeze set by erin (it would have lasted until 2026-12-03 "
                                     "09:00 UTC): power work postponed.")
    entry = audit.recent(services.database, 1)[0]  # type: ignore[arg-type]
    assert (entry.action, entry.target, entry.detail["reason"]) == ("freeze.lifted", "cluster", "power work postponed")  # type: ignore[index]
    assert submit_refused_is_none(services, "train-a")
    again = gpu(services, "U0ERIN", "unfreeze cluster")
    assert not again.ok and again.summary.startswith("The cluster is not frozen; nothing to lift")


def submit_refused_is_none(services: Services, pool: str) -> bool:
    try:
        submit(services, pool)
    except RequestRefused:
        return False
    return True


# ------------------------------------------------------------------ what a freeze does


def test_a_frozen_pool_refuses_new_requests_naming_who_until_when_and_why_and_stores_nothing(services):
    assert gpu(services, "U0ERIN", "freeze train-a until 2026-12-04 18:00 incident 4711").ok
    with pytest.raises(RequestRefused) as refused:
        submit(services, "train-a")
    assert str(refused.value) == (
        "No new drain request for train-a: pool train-a is frozen by erin until 2026-12-04 17:00 UTC "
        "(incident 4711). Ask again after that, or ask an admin to lift it with `/gpu unfreeze train-a`.")
    assert refused.value.code == "frozen"
    assert services.database.query("SELECT id FROM requests") == []  # type: ignore[union-attr]
    # Another pool is not frozen; the cluster's freeze covers every pool.
    assert submit_refused_is_none(services, "serve-b")
    assert gpu(services, "U0ERIN", "freeze cluster until 2026-12-03 09:00 change freeze").ok
    with pytest.raises(RequestRefused, match=r"No new drain request for serve-b: the cluster is frozen by erin until "
                                             r"2026-12-03 09:00 UTC \(change freeze\) \(the whole cluster is frozen\)"):
        submit(services, "serve-b")


def test_a_drain_typed_into_slack_for_a_frozen_pool_is_refused_with_the_freeze(services):
    assert gpu(services, "U0ERIN", "freeze serve-b until 18:00 launch day").ok
    reply = gpu(services, "U0ALICE", "drain gpu-b-01 for 1h NIC swap")
    assert not reply.ok and reply.title == "Refused"
    assert reply.summary.startswith("No new drain request for serve-b: pool serve-b is frozen by erin until "
                                    "2026-12-02 18:00 UTC (launch day).")


def test_an_approved_request_does_not_start_its_run_while_frozen_and_starts_after_the_freeze(services):
    request = submit(services, "serve-b")
    assert request.state == "approved"
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 --let-running-finish rollout").ok
    runs = services.runs
    assert runs is not None
    # Letting running runs finish does not let a new one start, whoever asks.
    for actor in (ALICE, None):
        with pytest.raises(RunRefused, match=r"The run of req-\w+ does not start: pool serve-b is frozen by erin"):
            runs.start(request.id, dry_run=False, now=NOW, actor=actor)
    assert services.requests.get(request.id).state == "approved"  # type: ignore[union-attr]
    assert runs.for_request(request.id) == []
    # Once it ended (no job lifted it), the run starts.
    later = NOW + dt.timedelta(hours=2, minutes=1)
    assert runs.start(request.id, dry_run=False, now=later, actor=None).state == "pending"


def test_what_holds_a_run_depends_on_whether_it_started_and_on_its_pool(services):
    db = services.database
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 --let-running-finish rollout").ok
    assert freezes.holding_run(db, pool="serve-b", started=False, now=NOW) is not None  # type: ignore[arg-type]
    assert freezes.holding_run(db, pool="serve-b", started=True, now=NOW) is None  # type: ignore[arg-type]
    assert freezes.holding_run(db, pool="train-a", started=False, now=NOW) is None  # type: ignore[arg-type]
    assert gpu(services, "U0ERIN", "freeze cluster until 11:00 hard stop").ok
    held = freezes.holding_run(db, pool="serve-b", started=True, now=NOW)  # type: ignore[arg-type]
    assert held is not None and held.target == "cluster"
    assert freezes.holding_run(db, pool="serve-b", started=True,  # type: ignore[arg-type]
                               now=dt.datetime(2026, 12, 2, 11, 0, tzinfo=UTC)) is None


# ------------------------------------------------------------------ where a freeze shows


def test_status_app_home_and_the_handover_show_a_freeze_first(services, make):
    assert gpu(services, "U0ERIN", "freeze train-a until 18:00 incident 4711").ok
    line = ("Pool train-a is frozen by erin until 2026-12-02 17:00 UTC: incident 4711; no new requests, "
            "no run starts, runs stop at their next node boundary")
    status = gpu(services, "U0DAVE", "status")
    assert [(n.severity, n.text, n.command) for n in status.sections[0].notices] == [("warning", line, "/gpu freezes")]
    assert gpu(services, "U0DAVE", "status train-a").sections[0].notices[0].text == line
    assert not gpu(services, "U0DAVE", "status serve-b").sections[0].notices

    home = str(home_view(status, [], now=NOW))
    assert "Pool train-a is frozen by erin until 2026-12-02 17:00 UTC" in home

    rotation = RotationConfig.model_validate({
        "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "Europe/Berlin",
        "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]}]})
    checklist = build_checklist(fleet=services.fleet.fleet(NOW), requests=[], runs_in_flight=[], previous=None,
                                rotation=rotation, shift=rotation.current_shift(NOW), now=NOW,
                                freezes=freezes.all_in_force(services.database, now=NOW))  # type: ignore[arg-type]
    first = checklist.needs_action[0]
    # The handover writes its times in the rotation's zone.
    assert (first.kind, first.severity, first.subject, first.text, first.command) == (
        "freeze", "warning", "train-a", line.replace("17:00 UTC", "18:00 CET"), "/gpu freezes")


def test_a_time_without_until_before_it_is_not_read_as_the_end():
    with pytest.raises(UsageError):
        read_freeze_words(["train-a", "tomorrow", "09:00"], pools=CONFIG.pools, now=NOW)


def test_a_database_from_before_freezes_gains_the_table_and_keeps_its_requests(tmp_path):
    from storage import requests as stored_requests
    from storage.migrations import MIGRATIONS, latest_version

    path = tmp_path / "gpuops.db"
    with open_database(path, migrations=MIGRATIONS[:6]) as old:
        request = stored_requests.create(old, kind="drain", pool="train-a", targets=["gpu-a-01"], window_start=None,
                                         window_end=None, reason="x", requester="U0ALICE", requester_name="alice",
                                         plan={"format": 1}, plan_hash="a" * 64, approvals_required=0,
                                         expires_at=NOW, at=NOW)
    with open_database(path) as db:
        assert db.schema_version == latest_version()
        assert stored_requests.get(db, id=request.id) is not None
        frozen, replaced = stored_freezes.create(db, target="train-a", until=NOW + dt.timedelta(hours=1), reason="",
                                                 let_running_finish=False, set_by="U0ERIN", set_by_name="erin", at=NOW)
        assert replaced is None and frozen.in_force(NOW) and not frozen.in_force(frozen.until)
        # A freeze that would end before it began is refused by the schema too.
        with pytest.raises(Exception, match="CHECK constraint failed"):
            stored_freezes.create(db, target="train-a", until=NOW, reason="", let_running_finish=False,
                                  set_by="U0ERIN", set_by_name="erin", at=NOW)
        assert [f.id for f in stored_freezes.in_force(db, now=NOW)] == [frozen.id]


def test_a_request_shows_the_freeze_that_keeps_it_or_its_run_from_going_on(services):
    approved = submit(services, "serve-b")
    queued = submit(services, "train-a")
    run = services.runs.start(queued.id, dry_run=False, now=NOW, actor=ALICE)  # type: ignore[union-attr]
    assert gpu(services, "U0ERIN", "freeze cluster until 12:00 --let-running-finish launch").ok
    line = ("The cluster is frozen by erin until 2026-12-02 12:00 UTC: launch; no new requests, no run starts, "
            "runs already going finish")

    shown = gpu(services, "U0DAVE", f"request {approved.id}")
    assert [(n.text, n.command) for n in shown.sections[-1].notices] == [(line, "/gpu freezes")]
    # A run that had not started is held even by a freeze that lets running runs finish.
    section = next(s for s in gpu(services, "U0DAVE", f"request {queued.id}").sections
                   if s.title and run.id in s.title)
    assert section.bullets[0] == ("A change freeze holds this run: nodes under way finish, no new node starts, and "
                                  f"it goes on by itself when the freeze ends. {line}")
    assert gpu(services, "U0ERIN", "unfreeze cluster").ok
    assert not any(n for s in gpu(services, "U0DAVE", f"request {approved.id}").sections for n in s.notices)


class _Host:
    """What the scheduler's window-start job needs, on one connection."""

    def __init__(self, db) -> None:
        self.config, self.fleet, self.db, self.notified = CONFIG, None, db, 0
        self.clusters = None  # one cluster

    @property
    def database(self) -> _Host:
        return self

    def get(self):
        return self.db

    def notify(self) -> None:
        self.notified += 1

    def roles_in(self, config):
        return None  # the configuration alone


def test_the_scheduler_starts_no_run_while_frozen_and_starts_it_at_the_first_tick_after(services):
    from bot.scheduler import start_window_runs

    request = submit(services, "serve-b")  # no window: runs as soon as it may
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 launch").ok
    host = _Host(services.database)
    start_window_runs(host, NOW + dt.timedelta(minutes=1))  # type: ignore[arg-type]
    start_window_runs(host, NOW + dt.timedelta(minutes=119))  # type: ignore[arg-type]
    assert services.runs.for_request(request.id) == []  # type: ignore[union-attr]
    assert services.requests.get(request.id).state == "approved"  # type: ignore[union-attr]
    start_window_runs(host, NOW + dt.timedelta(minutes=120))  # type: ignore[arg-type]
    assert [r.state for r in services.runs.for_request(request.id)] == ["pending"]  # type: ignore[union-attr]


# ------------------------------------------------------------------ the display zone


def test_a_freezes_end_is_written_in_the_display_zone_wherever_people_read_it(make, tmp_path: Path):
    shown_in_berlin = CONFIG.model_copy(
        update={"display": CONFIG.display.model_copy(update={"timezone": "Europe/Berlin"})})
    nodes = [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in (1, 2)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    db = open_database(tmp_path / "gpuops.db")
    services = Services.on_database(config=shown_in_berlin, fleet=StaticFleet(make.fleet(nodes, pods)), database=db)

    def say(who: str, text: str) -> Reply:
        return dispatch(text, actor=shown_in_berlin.actor(who), services=services, now=NOW, channel="C0OPS")

    # serve-b's windows have no zone: a bare time is read in UTC, and shown in Berlin's.
    frozen = say("U0ERIN", "freeze serve-b until 17:00 launch day")
    assert frozen.ok, frozen.summary
    assert frozen.summary.startswith("Pool serve-b is frozen by erin until 2026-12-02 18:00 CET: launch day")  # type: ignore[union-attr]
    assert {f.label: f.value for f in frozen.sections[0].facts}["Until"] == "2026-12-02 18:00 CET"
    assert say("U0DAVE", "status").sections[0].notices[0].text.startswith(
        "Pool serve-b is frozen by erin until 2026-12-02 18:00 CET")
    refused = say("U0ALICE", "drain gpu-b-01 for 1h NIC swap")
    assert refused.summary.startswith("No new drain request for serve-b: pool serve-b is frozen by erin until "  # type: ignore[union-attr]
                                      "2026-12-02 18:00 CET (launch day).")
    assert "2026-12-02 10:00 CET is not in the future (it is 2026-12-02 11:00 CET now)" in (
        say("U0ERIN", "freeze serve-b until today 09:00").summary or "")
    db.close()
