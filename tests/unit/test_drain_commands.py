"""`/gpu drain`, `/gpu drain done` and `/gpu drain extend` through the one dispatcher,
on a real SQLite request service and a fleet built from plain values: what an operator
asking for a drain window is shown, and what is stored."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from freezegun import freeze_time

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import open_database
from storage.steps import NewStep
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig
from workflows.engine.runs import step_params
from workflows.engine.steps.contract import Done, Waiting
from workflows.engine.steps.waiting import Hold
from workflows.fleet.pods import group_pods_by_node
from workflows.kube.objects import DisruptionBudget, NodeName, PodObject

UTC = dt.timezone.utc
# Wednesday 2 December 2026, 11:00 in Berlin; train-a drains on weekend nights.
NOW_TEXT = "2026-12-02 10:00:00"
SAT_0300_BERLIN = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
TRAIN_A = {
    "kind": "training",
    "windows": [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}],
    "max_unavailable": 2,
    "min_ready_gpus": 8,
}
ACCESS = {
    "users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0DAVE": ["viewer"], "U0ERIN": ["admin"]},
    "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0DAVE": "dave", "U0ERIN": "erin"},
}


def config(**train_a) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"train-a": {**TRAIN_A, **train_a},
                  "serve-b": {"kind": "serving", "windows": "always", "max_unavailable": "50%"}},
        "access": ACCESS})


@dataclass
class Workloads:
    pods: dict[NodeName, list[PodObject]]
    budgets: tuple[DisruptionBudget, ...] = ()

    def list_pods_bound_to(self, node: str) -> list[PodObject]:
        return self.pods.get(NodeName(node), [])

    def list_disruption_budgets(self, namespace: str) -> list[DisruptionBudget]:
        return [p for p in self.budgets if p.namespace == namespace]


@pytest.fixture
def now():
    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        yield dt.datetime.now(UTC)


def build(make, tmp_path: Path, cfg: GpuopsConfig, *, cordoned: tuple[str, ...] = (),
          delivery: str | None = None) -> Services:
    nodes = [make.node(f"gpu-a-{n:02d}", pool="train-a", unschedulable=f"gpu-a-{n:02d}" in cordoned)
             for n in range(1, 5)]
    nodes += [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in range(1, 3)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    pods += [make.workload("gpu-a-01", gpus=4, name="trainer-0", labels={"app": "trainer"}),
             make.workload("gpu-a-02", gpus=8, name="api-0", namespace="serve", owner_kind="ReplicaSet",
                           labels={"app": "api"})]
    db = open_database(tmp_path / "gpuops.db")
    workloads = Workloads(group_pods_by_node(pods), (
        DisruptionBudget(namespace="serve", name="api-pdb", selector={"app": "api"}, disruptions_allowed=0),))
    return Services.on_database(config=cfg, fleet=StaticFleet(make.fleet(nodes, pods)), database=db,
                                readers=(workloads,), delivery=delivery)


@pytest.fixture
def services(make, tmp_path: Path):
    built = build(make, tmp_path, config())
    yield built
    built.database.close()  # type: ignore[union-attr]


def run(services: Services, who: str, text: str, now: dt.datetime) -> Reply:
    return dispatch(text, actor=services.config.actor(who), services=services, now=now, channel="C0OPS")


def thread_texts(services: Services) -> list[str]:
    rows = services.database.query("SELECT payload FROM outbox ORDER BY id")  # type: ignore[union-attr]
    return [str(json.loads(r["payload"])["text"]) for r in rows]


def section(reply: Reply, title: str):
    return next(s for s in reply.sections if s.title == title)


def stored(services: Services) -> list[stored_requests.Request]:
    return stored_requests.in_states(services.database, states=stored_requests.FINISHED_STATES  # type: ignore[arg-type]
                                     | {"pending", "approved", "scheduled", "running"})


def test_a_drain_request_shows_the_plan_first_and_is_stored_pending(make, tmp_path, now):
    services = build(make, tmp_path, config(approvals={"drain": 1}))
    reply = run(services, "U0ALICE", "/gpu drain gpu-a-01 gpu-a-02 at sat 03:00 for 2h NIC swap", now)

    assert reply.ok, reply.summary
    request = services.requests.get(reply.title.split()[1])  # type: ignore[union-attr]
    assert request.state == "pending" and request.reason == "NIC swap"
    assert reply.title == f"Drain {request.id} · train-a"
    assert reply.summary == f"pending · 0 of 1 approvals · plan {request.short_hash}"
    facts = dict((f.label, f.value) for f in reply.sections[0].facts)
    assert facts["Window"] == "Sat 2026-12-05 03:00 CET - Sat 2026-12-05 05:00 CET"
    assert section(reply, "Waves").table.rows == (("1", "gpu-a-01, gpu-a-02", "16", "2 of 2 allowed", "16 (floor 8)"),)
    assert section(reply, "To be evicted").table.rows == (
        ("gpu-a-01", "ml/trainer-0", "4", "Job", "-"), ("gpu-a-02", "serve/api-0", "8", "ReplicaSet", "serve/api-pdb"))
    assert any("may block" in b for b in section(reply, "PodDisruptionBudgets").bullets)
    # The run's time, the hold included; the budget is named once, above, not again in the pre-flight.
    assert section(reply, "Pre-flight").bullets == (
        "A wave takes at most 30m to drain its nodes, and 10m after the hold to validate and uncordon them, at the "
        "configured timeouts (1 wave, the slowest node gpu-a-01; no past run of train-a to learn its pace from); "
        "its nodes are drained by 2026-12-05 02:30 UTC and held until the window ends (2026-12-05 04:00 UTC), then "
        "validated and uncordoned",
        "GPU signals are not configured (`signals`): no node's XIDs, double-bit ECC errors or row-remap failures are "
        "compared before and after its change; that gate is off.")
    # Alice may not approve her own request: her reply offers Cancel; bob's, Approve and Deny.
    assert [(i.action, i.value) for i in reply.intents] == [("cancel", request.id)]
    assert [i.action for i in run(services, "U0BOB", f"request {request.id}", now).intents] == [
        "approve", "deny"]
    assert request.window_start == dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    services.database.close()  # type: ignore[union-attr]


def test_a_drain_outside_the_pools_windows_is_refused_with_the_next_window_that_fits(services, now):
    reply = run(services, "U0ALICE", "drain gpu-a-01 at thu 03:00 for 1h", now)

    assert not reply.ok and reply.title == "Drain refused (outside-window)"
    assert "Sat 2026-12-05 02:00 CET" in (reply.summary or "")
    assert stored(services) == []


def test_a_drain_that_would_leave_too_few_ready_gpus_is_refused_with_the_numbers(make, tmp_path, now):
    services = build(make, tmp_path, config(min_ready_gpus=28))
    reply = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h", now)

    assert not reply.ok and reply.title == "Drain refused (min_ready_gpus)"
    assert "28" in (reply.summary or "") and "24" in (reply.summary or "")
    assert stored(services) == []
    services.database.close()  # type: ignore[union-attr]


def test_a_second_drain_overlapping_an_approved_one_is_refused_when_together_they_break_max_unavailable(services, now):
    first = run(services, "U0ALICE", "drain gpu-a-01 gpu-a-02 at sat 03:00 for 2h firmware", now)
    assert first.ok and first.summary.startswith("approved")  # type: ignore[union-attr]

    second = run(services, "U0ALICE", "drain gpu-a-03 at sat 04:00 for 2h cabling", now)

    assert not second.ok and second.title == "Drain refused (max_unavailable)"
    assert len(stored(services)) == 1


def test_a_node_a_person_cordoned_counts_against_max_unavailable(make, tmp_path, now):
    services = build(make, tmp_path, config(max_unavailable=1), cordoned=("gpu-a-04",))
    reply = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h", now)

    assert not reply.ok and reply.title == "Drain refused (max_unavailable)"
    assert "gpu-a-04" in (reply.summary or "")
    services.database.close()  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "expected"), [
    ("drain gpu-a-01 at 2026-12-01 03:00", "past"),
    ("drain gpu-a-10 at sat 03:00", "did you mean gpu-a-04"),
    ("drain gpu-a-01 gpu-b-01 at sat 03:00", "train-a"),
    ("drain gpu-a-01 at sat 03:00 for 2 hours", "2"),
])
def test_bad_drain_words_answer_with_usage_and_store_nothing(services, now, text, expected):
    reply = run(services, "U0ALICE", text, now)

    assert not reply.ok and expected in (reply.summary or "")
    assert reply.title.startswith("Usage: /gpu drain")
    assert stored(services) == []


def test_a_viewer_cannot_ask_for_a_drain(services, now):
    reply = run(services, "U0DAVE", "drain gpu-a-01 at sat 03:00 for 1h", now)

    assert not reply.ok and stored(services) == []


def test_drain_done_releases_the_hold_of_the_running_drain_and_tells_the_thread(services, now):
    asked = run(services, "U0ALICE", "drain gpu-b-01 for 2h kernel", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    request_id = request.id
    assert run(services, "U0BOB", f"approve {request_id} {request.short_hash}", now).ok
    services.runs.start(request_id, dry_run=False, now=now)  # type: ignore[union-attr]

    stranger = run(services, "U0DAVE", f"drain done {request_id}", now)
    assert not stranger.ok
    reply = run(services, "U0ALICE", f"drain done {request_id}", now + dt.timedelta(minutes=30))

    assert reply.ok, reply.summary
    (view,) = services.runs.for_request(request_id)  # type: ignore[union-attr]
    holds = [s for s in view.steps if s.kind == "hold"]
    assert holds and all(step_params(s)["released_at"] for s in holds)
    assert any("said drain done" in t for t in thread_texts(services))


def test_drain_done_said_again_ends_nothing_more_and_tells_the_thread_once(services, now):
    # As when the delivery of the first is run again: its replica died before answering.
    asked = run(services, "U0ALICE", "drain gpu-b-01 for 2h kernel", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    assert run(services, "U0BOB", f"approve {request.id} {request.short_hash}", now).ok
    services.runs.start(request.id, dry_run=False, now=now)  # type: ignore[union-attr]
    assert run(services, "U0ALICE", f"drain done {request.id}", now + dt.timedelta(minutes=30)).ok
    (view,) = services.runs.for_request(request.id)  # type: ignore[union-attr]
    released = [step_params(s) for s in view.steps if s.kind == "hold"]

    again = run(services, "U0ALICE", f"drain done {request.id}", now + dt.timedelta(minutes=31))

    assert not again.ok and "no hold left" in (again.summary or ""), again.summary
    (view,) = services.runs.for_request(request.id)  # type: ignore[union-attr]
    assert [step_params(s) for s in view.steps if s.kind == "hold"] == released
    assert sum("said drain done" in t for t in thread_texts(services)) == 1


def test_drain_extend_asked_again_by_the_delivery_that_extended_it_extends_once(make, tmp_path, now):
    # The delivery run again by another replica: the one that extended it died before answering.
    services = build(make, tmp_path, config(approvals={"drain": 1}))
    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    same = build(make, tmp_path, config(approvals={"drain": 1}), delivery="/gpu:U0ALICE:2002.1")

    # To the window's end, 06:00: planned from the extended end, the second would not fit.
    first = run(same, "U0ALICE", f"drain extend {request.id} 2h", now)
    again = run(same, "U0ALICE", f"drain extend {request.id} 2h", now + dt.timedelta(seconds=15))

    assert first.ok and again.ok, (first.summary, again.summary)
    extended = services.requests.get(request.id)  # type: ignore[union-attr]
    assert request.window_end is not None and extended.window_end == request.window_end + dt.timedelta(hours=2)
    assert request.id in again.title and "05:00 UTC" in render_text(again), render_text(again)
    replanned = [e for e in audit.for_request(services.database, request.id) if e.action == "request.replanned"]
    assert len(replanned) == 1
    same.database.close()  # type: ignore[union-attr]



    services = build(make, tmp_path, config(approvals={"drain": 1}))
    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    approved = run(services, "U0BOB", f"approve {request.id} {request.short_hash}", now)
    assert approved.summary.startswith("approved")  # type: ignore[union-attr]

    reply = run(services, "U0ALICE", f"drain extend {request.id} 1h", now)

    assert reply.ok, reply.summary
    after = services.requests.get(request.id)  # type: ignore[union-attr]
    assert after.state == "pending" and after.approvals_counted == 0
    assert after.window_end == request.window_end + dt.timedelta(hours=1)  # type: ignore[operator]
    assert after.plan_hash != request.plan_hash
    services.database.close()  # type: ignore[union-attr]


def test_an_admin_extending_someone_elses_drain_keeps_it_their_request(make, tmp_path, now):
    services = build(make, tmp_path, config(approvals={"drain": 1}))
    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]

    reply = run(services, "U0ERIN", f"drain extend {request.id} 1h", now)

    assert reply.ok, reply.summary
    after = services.requests.get(request.id)  # type: ignore[union-attr]
    assert after.requester == "U0ALICE" and after.plan_hash != request.plan_hash
    # Bob can still approve alice's re-planned request: it was not turned into erin's.
    approved = run(services, "U0BOB", f"approve {request.id} {after.short_hash}", now)
    assert approved.ok and approved.summary.startswith("approved"), approved.summary
    services.database.close()  # type: ignore[union-attr]


def test_extending_a_drain_on_a_pool_that_needs_no_approval_stays_approved(services, now):
    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    assert asked.summary.startswith("approved"), asked.summary  # type: ignore[union-attr]
    request_id = asked.title.split()[1]

    reply = run(services, "U0ALICE", f"drain extend {request_id} 1h", now)

    assert reply.ok, reply.summary
    assert reply.summary.startswith("approved"), reply.summary  # type: ignore[union-attr]
    assert "0 of 0" not in (reply.summary or "")
    assert services.requests.get(request_id).state == "approved"  # type: ignore[union-attr]
    assert [i.action for i in reply.intents] != ["approve", "deny"]


def test_drain_extend_past_the_pools_window_is_refused_and_changes_nothing(services, now):
    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]

    reply = run(services, "U0ALICE", f"drain extend {request.id} 4h", now)

    assert not reply.ok and reply.title == "Drain refused (window-too-short)"
    assert services.requests.get(request.id).plan_hash == request.plan_hash  # type: ignore[union-attr]


def test_status_says_when_a_pool_was_last_drained_as_the_handover_does_in_the_display_zone(services, now):
    before = run(services, "U0DAVE", "status", now)
    assert all(s.title != "Drains" for s in before.sections)

    asked = run(services, "U0ALICE", "drain gpu-a-01 at sat 03:00 for 1h firmware", now)
    request_id = asked.title.split()[1]
    waiting = section(run(services, "U0DAVE", "status", now), "Drains")
    assert waiting.table.columns == ("pool", "last drained", "by", "nodes", "active drain windows")
    assert waiting.table.rows[0][0] == "train-a" and waiting.table.rows[0][1] == "-"
    assert request_id in waiting.table.rows[0][4] and "UTC" in waiting.table.rows[0][4]

    # Its run drains the node: status says it in the handover's words.
    db = services.database
    drained_at = dt.datetime(2026, 12, 5, 3, 10, tzinfo=UTC)
    stored_requests.transition(db, id=request_id, expected="approved", new="running", at=drained_at)  # type: ignore[arg-type]
    ran = stored_runs.create(db, request_id=request_id, dry_run=False, at=drained_at)  # type: ignore[arg-type]
    (drain,) = stored_steps.add(db, run_id=ran.id, steps=[NewStep(0, "gpu-a-01", 0, "drain")])  # type: ignore[arg-type]
    stored_steps.transition(db, id=drain.id, expected="pending", new="done", at=drained_at)  # type: ignore[arg-type]
    stored_runs.transition(db, id=ran.id, expected="pending", new="succeeded", at=drained_at)  # type: ignore[arg-type]
    stored_requests.transition(db, id=request_id, expected="running", new="done", at=drained_at)  # type: ignore[arg-type]
    after = section(run(services, "U0DAVE", "status", drained_at), "Drains")
    assert after.table.rows == (("train-a", "2026-12-05 03:10 UTC", f"{request_id} (drain, succeeded)", "1 node", "-"),)


@dataclass
class HoldContext:
    params: dict
    intent: dict
    now: dt.datetime
    dry_run: bool = False
    kind: str = "hold"
    window_end: dt.datetime | None = None
    zone: dt.tzinfo = UTC


def test_a_hold_released_by_drain_done_ends_at_once_whether_it_was_waiting_or_not_begun_yet():
    start = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    params = {"until": "2026-12-05T04:00:00.000000Z", "released_by": "drain done"}
    hold = Hold()
    intent = hold.prepare(HoldContext(params=params, intent={}, now=start))  # type: ignore[arg-type]
    assert isinstance(hold.advance(HoldContext(params=params, intent=intent, now=start)), Waiting)  # type: ignore[arg-type]

    released = {**params, "released_at": "2026-12-05T02:30:00.000000Z"}
    later = start + dt.timedelta(minutes=30)
    assert isinstance(hold.advance(HoldContext(params=released, intent=intent, now=later)), Done)  # type: ignore[arg-type]
    not_begun = hold.prepare(HoldContext(params=released, intent={}, now=later))  # type: ignore[arg-type]
    assert not_begun["until"] == "2026-12-05T02:30:00.000000Z" and not_begun["warn_at"] is None
