"""`/gpu drain extend` on a running drain, through the one dispatcher on a real SQLite
request service: the run's holds get a later end at once on a pool that needs no
approval; elsewhere the later end waits for the pool's approvals on its own plan hash
(never the requester's, never on another hash) and lapses at the drain's end. Refusals
name why and change nothing: the pool's window, its capacity beside the other requests,
a run no longer holding, someone neither the requester nor an admin."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bot.clicks import Click, press
from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage import audit
from storage import steps as stored_steps
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig
from workflows.engine.runs import step_params
from workflows.engine.steps.contract import Done, Waiting
from workflows.engine.steps.waiting import WINDOW_ENDING_NOTICE, Hold
from workflows.fleet.pods import group_pods_by_node

UTC = dt.timezone.utc
# Saturday 5 December 2026, 03:00 in Berlin (02:00 UTC): train-a's window runs to 06:00 Berlin.
SAT_0300_BERLIN = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
WEEKEND_NIGHTS = [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}]
ACCESS = {
    "users": {"U0ALICE": ["operator", "approver"], "U0FRANK": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"],
              "U0ERIN": ["admin"]},
    "names": {"U0ALICE": "alice", "U0FRANK": "frank", "U0BOB": "bob", "U0CAROL": "carol", "U0ERIN": "erin"},
}


def config(**more: object) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        **more,
        "pools": {
            # Training: drains need no approval; weekend nights only; two nodes out at once.
            "train-a": {"kind": "training", "windows": WEEKEND_NIGHTS, "max_unavailable": 2, "min_ready_gpus": 0},
            # Serving: drains need two approvers, at any time.
            "serve-b": {"kind": "serving", "windows": "always", "max_unavailable": 2, "approvals": {"drain": 2}},
        },
        "access": ACCESS})


def build(make, tmp_path: Path, cfg: GpuopsConfig, *, delivery: str | None = None) -> Services:
    nodes = [make.node(f"gpu-a-{n:02d}", pool="train-a") for n in range(1, 5)]
    nodes += [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in range(1, 3)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    return Services.on_database(config=cfg, fleet=StaticFleet(make.fleet(nodes, pods)),
                                database=open_database(tmp_path / "gpuops.db"),
                                readers=(_NoWorkloads(group_pods_by_node(pods)),), delivery=delivery)


@pytest.fixture(params=[{}], ids=["utc"])
def services(make, tmp_path: Path, request):
    built = build(make, tmp_path, config(**request.param))
    yield built
    built.database.close()  # type: ignore[union-attr]


class _NoWorkloads:
    def __init__(self, pods) -> None:
        self.pods = pods

    def list_pods_bound_to(self, node: str):
        return []

    def list_disruption_budgets(self, namespace: str):
        return []


def gpu(services: Services, who: str, text: str, now: dt.datetime) -> Reply:
    return dispatch(text, actor=services.config.actor(who), services=services, now=now, channel="C0OPS")


def thread(services: Services) -> list[dict]:
    rows = services.database.query("SELECT payload FROM outbox ORDER BY id")  # type: ignore[union-attr]
    return [json.loads(r["payload"]) for r in rows]


def running_drain(services: Services, text: str, *, asked: dt.datetime, started: dt.datetime,
                  approvers: tuple[str, ...] = ()) -> str:
    """Ask for a drain, have it approved, start its run and put its holds in `running`
    (as the engine does once the nodes are cordoned and evicted)."""
    reply = gpu(services, "U0ALICE", text, asked)
    assert reply.ok, reply.summary
    request = services.requests.get(reply.title.split()[1])  # type: ignore[union-attr]
    for approver in approvers:
        assert gpu(services, approver, f"approve {request.id} {request.short_hash}", asked).ok
    run = services.runs.start(request.id, dry_run=False, now=started)  # type: ignore[union-attr]
    for step in run.steps:
        if step.kind in ("cordon", "evict"):
            stored_steps.transition(services.database, id=step.id, expected="pending", new="done", at=started)  # type: ignore[arg-type]
        elif step.kind == "hold":
            stored_steps.transition(services.database, id=step.id, expected="pending", new="running", at=started)  # type: ignore[arg-type]
    return request.id


def holds(services: Services, request_id: str):
    (run,) = services.runs.for_request(request_id)  # type: ignore[union-attr]
    return [s for s in run.steps if s.kind == "hold"]


def audit_rows(services: Services, request_id: str, action: str):
    return [r for r in audit.for_request(services.database, request_id) if r.action == action]  # type: ignore[arg-type]


# ------------------------------------------------------------------ a pool that needs no approval


def test_a_running_drain_on_a_pool_needing_no_approval_is_held_longer_at_once(services):
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    before = services.requests.get(request_id)  # type: ignore[union-attr]
    later = SAT_0300_BERLIN + dt.timedelta(minutes=45)

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 1h", later)

    assert reply.ok, reply.summary
    assert reply.summary == "the window now ends 2026-12-05 04:00:00 UTC (was 2026-12-05 03:00:00 UTC); " \
                            "the nodes stay held until then"
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert after.state == "running" and after.extension is None
    assert after.window_end == SAT_0300_BERLIN + dt.timedelta(hours=2)
    assert after.plan_hash != before.plan_hash and after.plan.waves == before.plan.waves
    assert after.plan.summary.window_end == after.window_end
    (hold,) = holds(services, request_id)
    assert step_params(hold)["extended_until"] == "2026-12-05T04:00:00.000000Z"
    assert step_params(hold)["until"] == "2026-12-05T03:00:00.000000Z"  # the plan's own end, as it was
    (extended,) = audit_rows(services, request_id, "request.extended")
    assert extended.actor == "U0ALICE" and extended.before == extended.after == "running"
    assert extended.detail["old_window_end"] == "2026-12-05T03:00:00.000000Z"
    assert extended.detail["window_end"] == "2026-12-05T04:00:00.000000Z"
    assert extended.detail["approvers"] == [] and extended.detail["nodes"] == ["gpu-a-01"]
    told = [m for m in thread(services) if m["event"] == "request.extended"]
    assert len(told) == 1 and told[0]["text"] == (
        f"The drain window of {request_id} now ends 2026-12-05 04:00:00 UTC (was 2026-12-05 03:00:00 UTC; the pool "
        "needs no approval for drains): its nodes stay held until then, and are validated and uncordoned after.")


def test_a_running_drain_held_longer_again_by_the_delivery_that_asked_it_is_held_longer_once(make, tmp_path,
                                                                                            services):
    # The delivery run again by another replica: the one that held it longer died before answering.
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    same = build(make, tmp_path, config(), delivery="/gpu:U0ALICE:3003.1")
    later = SAT_0300_BERLIN + dt.timedelta(minutes=45)

    # To the window's end, 06:00: asked from the held-longer end, the second would not fit.
    first = gpu(same, "U0ALICE", f"drain extend {request_id} 2h", later)
    again = gpu(same, "U0ALICE", f"drain extend {request_id} 2h", later + dt.timedelta(seconds=15))

    assert first.ok and again.ok, (first.summary, again.summary)
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert after.window_end == SAT_0300_BERLIN + dt.timedelta(hours=3)
    assert len(audit_rows(services, request_id, "request.extended")) == 1
    assert len([m for m in thread(services) if m["event"] == "request.extended"]) == 1
    same.database.close()  # type: ignore[union-attr]


SHOWN_IN_BERLIN = {"display": {"timezone": "Europe/Berlin"}}


@pytest.mark.parametrize("services", [SHOWN_IN_BERLIN], ids=["berlin"], indirect=True)
def test_a_running_drains_new_end_is_written_in_the_display_zone(services):
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    later = SAT_0300_BERLIN + dt.timedelta(minutes=45)

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 1h", later)

    assert reply.summary == "the window now ends 2026-12-05 05:00:00 CET (was 2026-12-05 04:00:00 CET); " \
                            "the nodes stay held until then"
    told = [m for m in thread(services) if m["event"] == "request.extended"]
    assert [m["text"] for m in told] == [
        f"The drain window of {request_id} now ends 2026-12-05 05:00:00 CET (was 2026-12-05 04:00:00 CET; the pool "
        "needs no approval for drains): its nodes stay held until then, and are validated and uncordoned after."]
    refused = gpu(services, "U0ALICE", f"drain extend {request_id} 3h", later)
    assert "cannot be held until Sat 2026-12-05 08:00 CET: pool train-a's window ends at Sat 2026-12-05 06:00 CET" \
        in (refused.summary or "")
    # On a pool that asks for approvals, the thread asks for the later end in the same zone.
    on_b = running_drain(services, "drain gpu-b-01 for 1h NIC swap", asked=SAT_0300_BERLIN, started=SAT_0300_BERLIN,
                         approvers=("U0BOB", "U0CAROL"))
    asked = gpu(services, "U0ALICE", f"drain extend {on_b} 30m", later)
    assert asked.summary.startswith("the window end 2026-12-05 04:30:00 CET waits for approval")  # type: ignore[union-attr]
    (ask,) = [m for m in thread(services) if m["event"] == "request.extension_asked"]
    assert f"asked to hold the nodes of {on_b} until 2026-12-05 04:30:00 CET instead of 2026-12-05 04:00:00 CET" \
        in ask["text"]


def test_an_admin_may_hold_someone_elses_running_drain_longer_but_another_operator_may_not(services):
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    later = SAT_0300_BERLIN + dt.timedelta(minutes=10)

    stranger = gpu(services, "U0FRANK", f"drain extend {request_id} 1h", later)
    assert not stranger.ok
    assert f"Only the requester (alice) or an admin can extend {request_id}" in (stranger.summary or "")
    assert services.requests.get(request_id).window_end == SAT_0300_BERLIN + dt.timedelta(hours=1)  # type: ignore[union-attr]

    admin = gpu(services, "U0ERIN", f"drain extend {request_id} 1h", later)
    assert admin.ok, admin.summary
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert after.window_end == SAT_0300_BERLIN + dt.timedelta(hours=2) and after.requester == "U0ALICE"


def test_holding_past_the_pools_window_is_refused_saying_how_much_more_fits(services):
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    before = services.requests.get(request_id)  # type: ignore[union-attr]

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 3h", SAT_0300_BERLIN + dt.timedelta(minutes=30))

    assert not reply.ok and reply.title == "Drain refused (window-too-short)"
    assert "pool train-a's window ends at Sat 2026-12-05 05:00 UTC" in (reply.summary or "")
    assert "Ask for at most 2h more." in (reply.summary or "")
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert (after.window_end, after.plan_hash, after.extension) == (before.window_end, before.plan_hash, None)
    assert "extended_until" not in step_params(holds(services, request_id)[0])
    assert audit_rows(services, request_id, "request.extension_asked") == []


def test_holding_longer_is_refused_when_the_pool_would_have_too_many_nodes_out_beside_the_next_drain(services):
    asked = SAT_0300_BERLIN - dt.timedelta(days=3)
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware", asked=asked,
                               started=SAT_0300_BERLIN)
    # The next drain fits because ours gives gpu-a-01 back at 04:00 Berlin: two nodes out then.
    nxt = gpu(services, "U0ALICE", "drain gpu-a-02 gpu-a-03 at sat 04:00 for 1h cables", asked)
    assert nxt.ok and nxt.summary.startswith("approved"), nxt.summary  # type: ignore[union-attr]

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 30m", SAT_0300_BERLIN + dt.timedelta(minutes=30))

    assert not reply.ok and reply.title == "Drain refused (max_unavailable)"
    assert reply.summary.startswith(f"{request_id} cannot hold its nodes until Sat 2026-12-05 03:30 UTC")  # type: ignore[union-attr]
    assert services.requests.get(request_id).window_end == SAT_0300_BERLIN + dt.timedelta(hours=1)  # type: ignore[union-attr]
    # Its own node is counted once: alone, it may be held as long as the window allows.
    assert gpu(services, "U0ALICE", f"cancel {nxt.title.split()[1]}", SAT_0300_BERLIN).ok
    assert gpu(services, "U0ALICE", f"drain extend {request_id} 2h", SAT_0300_BERLIN + dt.timedelta(minutes=30)).ok


def test_a_run_that_no_longer_holds_its_nodes_cannot_be_extended_and_says_why(services):
    request_id = running_drain(services, "drain gpu-a-01 at sat 03:00 for 1h firmware",
                               asked=SAT_0300_BERLIN - dt.timedelta(days=3), started=SAT_0300_BERLIN)
    later = SAT_0300_BERLIN + dt.timedelta(minutes=20)
    assert gpu(services, "U0ALICE", f"drain done {request_id}", later).ok

    released = gpu(services, "U0ALICE", f"drain extend {request_id} 1h", later)
    assert not released.ok
    assert released.summary == (f"The hold of {request_id} was already ended with `/gpu drain done`: its nodes are "
                                "being validated and uncordoned; for more time, ask for a new drain with `/gpu drain`.")

    (hold,) = holds(services, request_id)
    stored_steps.transition(services.database, id=hold.id, expected="running", new="done", at=later)  # type: ignore[arg-type]
    validating = gpu(services, "U0ALICE", f"drain extend {request_id} 1h", later)
    assert not validating.ok
    assert validating.summary == (f"{request_id} no longer holds its nodes: its window has ended and they are being "
                                  "validated and uncordoned; for more time, ask for a new drain with `/gpu drain`.")
    assert services.requests.get(request_id).window_end == SAT_0300_BERLIN + dt.timedelta(hours=1)  # type: ignore[union-attr]


def test_an_open_ended_running_drain_is_ended_with_drain_done_not_extended(services):
    request_id = running_drain(services, "drain gpu-b-01 kernel", asked=SAT_0300_BERLIN, started=SAT_0300_BERLIN,
                               approvers=("U0BOB", "U0CAROL"))

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 1h", SAT_0300_BERLIN)

    assert not reply.ok and reply.summary == f"{request_id} has no window end: it lasts until `/gpu drain done {request_id}`."


# ------------------------------------------------------------------ a pool that needs approvals


def test_on_a_pool_needing_approvals_the_later_end_waits_for_two_approvers_on_its_own_hash(services):
    start = SAT_0300_BERLIN
    request_id = running_drain(services, "drain gpu-b-01 for 1h kernel", asked=start, started=start,
                               approvers=("U0BOB", "U0CAROL"))
    before = services.requests.get(request_id)  # type: ignore[union-attr]
    later = start + dt.timedelta(minutes=40)

    reply = gpu(services, "U0ALICE", f"drain extend {request_id} 30m", later)

    assert reply.ok, reply.summary
    asked = services.requests.get(request_id)  # type: ignore[union-attr]
    extension = asked.extension
    assert extension is not None and extension.window_end == before.window_end + dt.timedelta(minutes=30)  # type: ignore[operator]
    assert reply.summary == ("the window end 2026-12-05 03:30:00 UTC waits for approval (0 of 2 approvals · plan "
                             f"{extension.short_hash}); until then the nodes are held to 2026-12-05 03:00:00 UTC")
    # Nothing moved yet: the run holds to the old end.
    assert (asked.window_end, asked.plan_hash, asked.state) == (before.window_end, before.plan_hash, "running")
    assert "extended_until" not in step_params(holds(services, request_id)[0])
    asked_text = next(m["text"] for m in thread(services) if m["event"] == "request.extension_asked")
    assert f"`/gpu approve {request_id} {extension.short_hash}`" in asked_text

    own = gpu(services, "U0ALICE", f"approve {request_id} {extension.short_hash}", later)
    assert not own.ok and "someone else has to approve it" in (own.summary or "")
    stale = gpu(services, "U0BOB", f"approve {request_id} {before.short_hash}", later)
    assert not stale.ok and extension.short_hash in (stale.summary or "")
    first = gpu(services, "U0BOB", f"approve {request_id} {extension.short_hash}", later)
    assert first.ok, first.summary
    again = gpu(services, "U0BOB", f"approve {request_id} {extension.short_hash}", later)
    assert not again.ok and "You already approved" in (again.summary or "")
    halfway = services.requests.get(request_id)  # type: ignore[union-attr]
    assert halfway.window_end == before.window_end and halfway.extension.approvers == ("U0BOB",)  # type: ignore[union-attr]
    assert "extended_until" not in step_params(holds(services, request_id)[0])

    second = gpu(services, "U0CAROL", f"approve {request_id} {extension.short_hash}", later)

    assert second.ok, second.summary
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert after.state == "running" and after.extension is None
    assert after.window_end == extension.window_end and after.plan_hash == extension.plan_hash
    assert step_params(holds(services, request_id)[0])["extended_until"] == "2026-12-05T03:30:00.000000Z"
    (extended,) = audit_rows(services, request_id, "request.extended")
    assert extended.actor == "U0CAROL" and extended.detail["approvers"] == ["U0BOB", "U0CAROL"]
    assert extended.detail["old_window_end"] == "2026-12-05T03:00:00.000000Z"
    assert any("approved by bob and carol" in m["text"] for m in thread(services) if m["event"] == "request.extended")


def test_the_approve_button_of_a_pending_extension_is_bound_to_its_hash_and_not_shown_to_the_requester(services):
    start = SAT_0300_BERLIN
    request_id = running_drain(services, "drain gpu-b-01 for 1h kernel", asked=start, started=start,
                               approvers=("U0BOB", "U0CAROL"))
    gpu(services, "U0ALICE", f"drain extend {request_id} 30m", start)
    extension = services.requests.get(request_id).extension  # type: ignore[union-attr]
    assert extension is not None

    shown = gpu(services, "U0BOB", f"request {request_id}", start)
    facts = {f.label: f.value for section in shown.sections for f in section.facts}
    assert facts["Extension"] == ("to Sat 2026-12-05 03:30 UTC, 0 of 2 approvals "
                                  f"(plan {extension.short_hash}); lapses at Sat 2026-12-05 03:00 UTC if not approved")
    assert [(i.action, i.value) for i in shown.intents if i.action == "approve"] == [
        ("approve", f"{request_id}/{extension.plan_hash}")]
    assert [i for i in gpu(services, "U0ALICE", f"drain extend {request_id} 30m", start).intents] == []

    (button,) = [i for i in gpu(services, "U0BOB", f"request {request_id}", start).intents if i.action == "approve"]
    first = press(Click(action=button.action, value=button.value, actor=services.config.actor("U0BOB"), now=start),
                  services)
    assert first.notice.ok and first.notice.summary == f"You approved {request_id} (1 of 2)."
    decisions = next(s for s in gpu(services, "U0BOB", f"request {request_id}", start).sections
                     if s.title == "Decisions")
    assert decisions.bullets[-1] == f"bob approved plan {extension.short_hash}"  # it counts towards the extension
    second = press(Click(action=button.action, value=button.value, actor=services.config.actor("U0CAROL"),
                         now=start), services)
    assert second.notice.ok and second.notice.summary == f"You approved {request_id}: it has all 2 approvals it needs."
    assert services.requests.get(request_id).window_end == extension.window_end  # type: ignore[union-attr]


def test_an_extension_not_approved_before_the_old_end_lapses_and_the_thread_hears_it(services):
    start = SAT_0300_BERLIN
    request_id = running_drain(services, "drain gpu-b-01 for 1h kernel", asked=start, started=start,
                               approvers=("U0BOB", "U0CAROL"))
    assert gpu(services, "U0ALICE", f"drain extend {request_id} 30m", start + dt.timedelta(minutes=10)).ok
    extension = services.requests.get(request_id).extension  # type: ignore[union-attr]
    assert extension is not None and extension.expires_at == start + dt.timedelta(hours=1)
    assert gpu(services, "U0BOB", f"approve {request_id} {extension.short_hash}", start + dt.timedelta(minutes=20)).ok

    services.requests.expire_due(start + dt.timedelta(minutes=59))  # type: ignore[union-attr]
    assert services.requests.get(request_id).extension is not None  # type: ignore[union-attr]
    late = gpu(services, "U0CAROL", f"approve {request_id} {extension.short_hash}", start + dt.timedelta(hours=1))

    assert not late.ok
    lapsed = (f"The extension of {request_id} to 2026-12-05 03:30:00 UTC lapsed: it was not approved before its "
              "drain window ended (2026-12-05 03:00:00 UTC), so the window ended then.")
    assert late.summary == lapsed
    after = services.requests.get(request_id)  # type: ignore[union-attr]
    assert after.extension is None and after.window_end == start + dt.timedelta(hours=1)
    assert "extended_until" not in step_params(holds(services, request_id)[0])
    assert [m["text"] for m in thread(services) if m["event"] == "request.extension_lapsed"] == [lapsed]
    (row,) = audit_rows(services, request_id, "request.extension_lapsed")
    assert row.detail["approvals_counted"] == 1 and row.detail["approvals_required"] == 2


def test_the_sweep_lets_an_unapproved_extension_lapse_at_the_old_end(services):
    start = SAT_0300_BERLIN
    request_id = running_drain(services, "drain gpu-b-01 for 1h kernel", asked=start, started=start,
                               approvers=("U0BOB", "U0CAROL"))
    assert gpu(services, "U0ALICE", f"drain extend {request_id} 30m", start).ok

    services.requests.expire_due(start + dt.timedelta(hours=1))  # type: ignore[union-attr]

    assert services.requests.get(request_id).extension is None  # type: ignore[union-attr]
    assert len(audit_rows(services, request_id, "request.extension_lapsed")) == 1


# ------------------------------------------------------------------ the hold step


class HoldContext:
    def __init__(self, params: dict, intent: dict, now: dt.datetime) -> None:
        self.params, self.intent, self.now = params, intent, now
        self.dry_run, self.window_end, self.request_id = False, None, "req-7f3a2c"
        self.kind, self.zone = "hold", UTC


def test_a_hold_extended_while_it_waits_ends_at_the_later_end_and_warns_once_more_before_it():
    start = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    params = {"until": "2026-12-05T04:00:00.000000Z", "released_by": "drain done"}
    hold = Hold()
    intent = hold.prepare(HoldContext(params, {}, start))
    warned = hold.advance(HoldContext(params, intent, start + dt.timedelta(hours=2) - WINDOW_ENDING_NOTICE))
    assert isinstance(warned, Waiting) and warned.notice is not None and warned.notice.key == "window-ending"

    extended = {**params, "extended_until": "2026-12-05T05:00:00.000000Z"}
    at_old_end = start + dt.timedelta(hours=2)
    held = hold.advance(HoldContext(extended, intent, at_old_end))
    assert isinstance(held, Waiting) and held.notice is None
    assert held.retry_in == (dt.timedelta(hours=1) - WINDOW_ENDING_NOTICE).total_seconds()
    before_new_end = hold.advance(HoldContext(extended, intent, start + dt.timedelta(hours=3) - WINDOW_ENDING_NOTICE))
    assert isinstance(before_new_end, Waiting) and before_new_end.notice is not None
    assert before_new_end.notice.key == "window-ending"
    assert before_new_end.notice.again_for == "2026-12-05T05:00:00.000000Z" and warned.notice.again_for is None
    assert "ends at 2026-12-05 05:00:00 UTC" in before_new_end.notice.text
    assert isinstance(hold.advance(HoldContext(extended, intent, start + dt.timedelta(hours=3))), Done)


def test_an_extension_never_shortens_a_hold_and_drain_done_still_ends_an_extended_one():
    start = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    params = {"until": "2026-12-05T04:00:00.000000Z", "extended_until": "2026-12-05T03:00:00.000000Z"}
    hold = Hold()
    intent = hold.prepare(HoldContext(params, {}, start))
    assert isinstance(hold.advance(HoldContext(params, intent, start + dt.timedelta(hours=1, minutes=30))), Waiting)

    later = {**params, "extended_until": "2026-12-05T06:00:00.000000Z", "released_at": "2026-12-05T03:00:00.000000Z"}
    assert isinstance(hold.advance(HoldContext(later, intent, start + dt.timedelta(hours=1))), Done)
