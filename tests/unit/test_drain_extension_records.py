"""What a running drain's extension writes and says, pinned to the word, on a real SQLite
request service called as `DrainService` calls it: the stored extension (its end, who
asked, its deadline, who approved), the audit rows (every field), the thread's posts
(channel, thread, dedupe key, payload), the `HoldExtension` written into the run's holds,
and each refusal's sentence and code. Then the decisions: who may ask, which end counts as
later, the approvals the pool asks for now (a rule tightened since the drain started
applies), the last approval refused when the run no longer holds, the lapse at its
deadline to the second, and a compare-and-set that lost to another replica.

Times are shown in Berlin (the display zone), so a sentence written in another zone reads
differently."""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from storage import audit
from storage import requests as stored_requests
from storage import steps as stored_steps
from storage.database import Database
from storage.ids import RequestId
from storage.step_params import HoldExtension
from storage.steps import Step
from tests.unit.test_runs import drain_plan, outbox_rows
from workflows.access import Actor
from workflows.config import GpuopsConfig
from workflows.drain.plan import extended_plan
from workflows.engine.runs import RunService, step_params
from workflows.plans import plan_hash, plan_to_json
from workflows.requests import messages as say
from workflows.requests.errors import RequestAccessDenied, RequestRefused
from workflows.requests.policy import RefusalCode
from workflows.requests.service import RequestService
from workflows.requests.views import ExtensionView, RequestView

UTC = dt.timezone.utc
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NOW = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)  # 03:00 in Berlin: the drain starts, for an hour
END = NOW + dt.timedelta(hours=1)
ASKED = NOW + dt.timedelta(minutes=10)  # when Ada asks for more time
APPROVED = NOW + dt.timedelta(minutes=20)  # when an approver says yes
THREAD = "1764900000.000100"


def settings(*, serve_b: int = 2, train_a: int = 0, ttl: str = "24h") -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"train-a": {"kind": "training", "windows": "always", "approvals": {"drain": train_a}},
                  "serve-b": {"kind": "serving", "windows": "always", "approvals": {"drain": serve_b},
                              "request_ttl": ttl}},
        "access": {"users": {"U0ADA": ["operator", "approver"], "U0FRED": ["operator"], "U0BOB": ["approver"],
                             "U0CAT": ["approver"], "U0GUS": ["approver"], "U0DAN": ["admin"]},
                   "names": {"U0ADA": "Ada", "U0FRED": "Fred", "U0BOB": "Bob", "U0CAT": "Cat", "U0GUS": "Gus",
                             "U0DAN": "Dan"}},
        "display": {"timezone": "Europe/Berlin"}})


CONFIG = settings()
ada, fred, bob, cat = (CONFIG.actor(u) for u in ("U0ADA", "U0FRED", "U0BOB", "U0CAT"))


class Drain:
    """Ada's drain of gpu-01 on `pool` from NOW to END (or with no end), approved by Bob
    and Cat where the pool asks (unless not `approved`), told in a Slack thread, and its
    run started (unless not `start`): its hold step pending, as the engine finds it before
    the node is cordoned."""

    def __init__(self, db: Database, pool: str = "serve-b", *, config: GpuopsConfig = CONFIG,
                 ends: bool = True, approved: bool = True, start: bool = True) -> None:
        self.db, self.config = db, config
        service = self.service()
        self.plan = drain_plan(pool)
        request = service.submit(ada, kind="drain", pool=pool, targets=["gpu-01"], plan=self.plan,
                                 window_start=NOW, window_end=END if ends else None, reason="firmware",
                                 channel="C0OPS", now=NOW)
        self.id = request.id
        assert stored_requests.set_thread(db, id=RequestId(self.id), channel="C0OPS", thread_ts=THREAD)
        for approver in (bob, cat)[:request.approvals_required if approved else 0]:
            service.approve(approver, self.id, plan_hash=request.plan_hash, now=NOW)
        if start:
            self.run_id = RunService(db, requests=service).start(self.id, dry_run=False, now=NOW, actor=ada).id

    def service(self, config: GpuopsConfig | None = None, *,
                roles: Callable[[str], Actor] | None = None) -> RequestService:
        return RequestService(self.db, config or self.config, roles=roles)

    def get(self) -> RequestView:
        return self.service().get(self.id)

    def extend(self, who: Actor, to: dt.datetime, *, at: dt.datetime = ASKED,
               config: GpuopsConfig | None = None) -> RequestView:
        """`who` asks for the drain to end at `to`, as `DrainService.extend_running` asks."""
        return self.service(config).extend_running(who, self.id, extended_plan(self.plan, to), window_end=to, now=at)

    def approve(self, who: Actor, *, at: dt.datetime = APPROVED, config: GpuopsConfig | None = None,
                roles: Callable[[str], Actor] | None = None) -> RequestView:
        extension = self.get().extension
        assert extension is not None
        return self.service(config, roles=roles).approve(who, self.id, plan_hash=extension.plan_hash, now=at)

    def audited(self, action: str) -> list[dict[str, Any]]:
        """The request's audit rows of `action`, every field but the hash chain's."""
        return [{k: v for k, v in dataclasses.asdict(e).items() if k not in ("seq", "prev_hash", "hash")}
                for e in audit.for_request(self.db, RequestId(self.id)) if e.action == action]

    def thread(self, event: str) -> list[dict[str, Any]]:
        """The posts of `event` queued for the request's thread, as the notifier reads them."""
        return [{k: row[k] for k in ("channel", "thread_ts", "kind", "dedupe_key", "payload")}
                for row in outbox_rows(self.db) if row["payload"]["event"] == event]

    def hold(self) -> Step:
        (hold,) = [s for s in stored_steps.for_run(self.db, run_id=self.run_id) if s.kind == "hold"]
        return hold

    def untouched(self, *, extension: ExtensionView | None = None) -> None:
        """Nothing moved: the old end and plan, the hold as planned, nothing extended."""
        now = self.get()
        assert (now.state, now.window_end, now.plan_hash, now.extension) == ("running", END, plan_hash(self.plan),
                                                                             extension)
        assert step_params(self.hold()) == {"seconds": 3600}
        assert self.audited("request.extended") == [] and self.thread("request.extended") == []


def later(minutes: int) -> dt.datetime:
    return END + dt.timedelta(minutes=minutes)


def refusal(act: Callable[[], object], kind: type[RequestRefused] = RequestRefused) -> tuple[str, RefusalCode | None]:
    """Why `act` was refused (it must be), and the refusal's code."""
    with pytest.raises(kind) as refused:
        act()
    return refused.value.reason, refused.value.code


def asked_post(drain: Drain, *, to: dt.datetime, required: int, digest: str) -> dict[str, Any]:
    return {"channel": "C0OPS", "thread_ts": THREAD, "kind": "post", "dedupe_key": f"{drain.id}/extension/{digest}",
            "payload": {"event": "request.extension_asked", "request_id": drain.id, "pool": "serve-b",
                        "kind": "drain", "state": "running", "people": ["U0ADA"],
                        "text": say.thread_extension_asked(request_id=drain.id, actor="Ada", window_end=END,
                                                           extended_to=to, plan_hash=digest, required=required,
                                                           zone=BERLIN)}}


# ------------------------------------------------------------------ asked


def test_asking_to_hold_longer_stores_the_extension_audits_every_field_and_asks_the_thread_for_approvals(db):
    drain = Drain(db)
    to = later(30)
    digest = plan_hash(extended_plan(drain.plan, to))

    view = drain.extend(ada, to)

    assert view.extension == ExtensionView(window_end=to, plan_hash=digest, asked_by="U0ADA", asked_at=ASKED,
                                           expires_at=END, approvers=())
    stored = stored_requests.get(db, id=RequestId(drain.id))
    assert stored is not None and stored.extension is not None
    assert stored.extension.plan == plan_to_json(extended_plan(drain.plan, to))
    assert drain.audited("request.extension_asked") == [{
        "at": ASKED, "actor": "U0ADA", "k8s_identity": None, "action": "request.extension_asked",
        "target": "serve-b", "request_id": drain.id, "run_id": None, "before": "running", "after": "running",
        "detail": {"old_window_end": "2026-12-05T03:00:00.000000Z", "window_end": "2026-12-05T03:30:00.000000Z",
                   "plan_hash": digest, "approvals_required": 2, "expires_at": "2026-12-05T03:00:00.000000Z"}}]
    assert drain.thread("request.extension_asked") == [asked_post(drain, to=to, required=2, digest=digest)]
    assert "04:30:00 CET" in drain.thread("request.extension_asked")[0]["payload"]["text"]
    # Until it is approved the run holds to the old end.
    assert (view.window_end, view.plan_hash, step_params(drain.hold())) == (END, plan_hash(drain.plan),
                                                                          {"seconds": 3600})


def test_an_admin_asks_for_someone_elses_drain_and_is_named_as_the_one_who_asked(db):
    drain = Drain(db)

    view = drain.extend(CONFIG.actor("U0DAN"), later(15))

    assert view.extension is not None and view.extension.asked_by == "U0DAN"
    (row,) = drain.audited("request.extension_asked")
    assert row["actor"] == "U0DAN"
    (post,) = drain.thread("request.extension_asked")
    assert post["payload"]["people"] == ["U0ADA", "U0DAN"] and post["payload"]["text"].startswith("Dan asked")


def test_an_extension_waits_no_longer_than_the_pools_request_ttl_when_that_comes_before_the_drains_end(db):
    drain = Drain(db, config=settings(ttl="20m"))

    view = drain.extend(ada, later(30))

    assert view.extension is not None and view.extension.expires_at == ASKED + dt.timedelta(minutes=20)
    (row,) = drain.audited("request.extension_asked")
    assert row["detail"]["expires_at"] == "2026-12-05T02:30:00.000000Z"


def test_a_pool_rule_tightened_since_the_drain_started_makes_its_extension_wait_for_approval(db):
    drain = Drain(db, "train-a")  # started when train-a drains needed no approval
    tightened = settings(train_a=1)
    to = later(30)

    view = drain.extend(ada, to, config=tightened)

    assert view.window_end == END and view.extension is not None and view.extension.window_end == to
    (row,) = drain.audited("request.extension_asked")
    assert row["detail"]["approvals_required"] == 1
    assert drain.audited("request.extended") == []


# ------------------------------------------------------------------ refused, changing nothing


def test_a_drain_not_started_yet_is_refused_as_not_running_naming_its_state(db):
    drain = Drain(db, start=False)

    reason, code = refusal(lambda: drain.extend(ada, later(30)))

    assert (reason, code) == (say.not_extendable(drain.id, state="approved"), None)
    assert drain.get().extension is None


def test_a_pending_drain_past_its_approval_deadline_is_refused_as_expired(db):
    drain = Drain(db, config=settings(ttl="30m"), approved=False, start=False)
    assert drain.get().state == "pending"

    reason, code = refusal(lambda: drain.extend(ada, later(30), at=NOW + dt.timedelta(minutes=30)))

    assert (reason, code) == (say.not_extendable(drain.id, state="expired"), None)


def test_someone_neither_the_requester_nor_an_admin_is_refused_by_name_and_code(db):
    drain = Drain(db)

    reason, code = refusal(lambda: drain.extend(fred, later(30)), RequestAccessDenied)

    assert (reason, code) == ("Only the requester (Ada) or an admin can extend " + drain.id + ".",
                              RefusalCode.NOT_REQUESTER_OR_ADMIN)
    assert reason == say.not_requester_or_admin(drain.id, requester_name="Ada", verb="extend")
    drain.untouched()


def test_a_running_drain_with_no_window_end_is_refused_as_held_until_drain_done(db):
    drain = Drain(db, ends=False)

    reason, code = refusal(lambda: drain.service().extend_running(ada, drain.id, drain.plan, window_end=later(30),
                                                                  now=ASKED))

    assert (reason, code) == (f"{drain.id} has no window end: it lasts until `/gpu drain done {drain.id}`.",
                              RefusalCode.NOT_HOLDING)
    assert drain.get().extension is None


@pytest.mark.parametrize("minutes", [0, -10], ids=["the-same-end", "an-earlier-end"])
def test_an_end_not_later_than_the_current_one_is_refused_naming_the_current_end_in_the_display_zone(db, minutes):
    drain = Drain(db)

    reason, code = refusal(lambda: drain.extend(ada, later(minutes)))

    assert (reason, code) == (say.extend_not_later(drain.id, window_end=END, zone=BERLIN), None)
    assert "04:00:00 CET" in reason and drain.id in reason
    drain.untouched()
    assert drain.audited("request.extension_asked") == []


def test_a_run_whose_hold_was_ended_with_drain_done_is_refused_as_no_longer_holding(db):
    drain = Drain(db)
    RunService(db).release_hold(ada, drain.id, now=ASKED)

    reason, code = refusal(lambda: drain.extend(ada, later(30)))

    assert (reason, code) == (say.extend_released(drain.id), RefusalCode.NOT_HOLDING)
    assert drain.get().extension is None and drain.audited("request.extension_asked") == []


# ------------------------------------------------------------------ approved


def test_a_first_approval_is_audited_and_told_with_the_count_and_the_hold_keeps_the_old_end(db):
    drain = Drain(db)
    to = later(30)
    drain.extend(ada, to)
    digest = plan_hash(extended_plan(drain.plan, to))

    view = drain.approve(bob)

    assert view.extension is not None and view.extension.approvers == ("U0BOB",)
    assert (view.window_end, step_params(drain.hold())) == (END, {"seconds": 3600})
    assert drain.audited("request.extension_approval") == [{
        "at": APPROVED, "actor": "U0BOB", "k8s_identity": None, "action": "request.extension_approval",
        "target": "serve-b", "request_id": drain.id, "run_id": None, "before": "running", "after": "running",
        "detail": {"plan_hash": digest, "window_end": "2026-12-05T03:30:00.000000Z", "approvals_counted": 1,
                   "approvals_required": 2}}]
    text = say.thread_extension_approval(request_id=drain.id, approver="Bob", extended_to=to, counted=1, required=2,
                                         zone=BERLIN)
    assert drain.thread("request.extension_approval") == [{
        "channel": "C0OPS", "thread_ts": THREAD, "kind": "post", "dedupe_key": f"{drain.id}/approval/U0BOB/{digest}",
        "payload": {"event": "request.extension_approval", "request_id": drain.id, "pool": "serve-b",
                    "kind": "drain", "state": "running", "text": text, "people": ["U0ADA", "U0BOB"]}}]
    assert text == f"Bob approved holding {drain.id} until 2026-12-05 04:30:00 CET (1 of 2)."
    assert drain.audited("request.extended") == []


def test_the_requester_cannot_approve_their_own_extension(db):
    drain = Drain(db)
    drain.extend(ada, later(30))
    pending = drain.get().extension

    reason, code = refusal(lambda: drain.approve(ada))

    assert (reason, code) == (say.own_request_approval(drain.id), RefusalCode.OWN_REQUEST)
    assert drain.get().extension == pending and drain.audited("request.extension_approval") == []


def approved_once_of_two(db) -> tuple[Drain, dt.datetime, str]:
    """A running drain whose extension Ada asked for 30 minutes more, approved once (by Bob)
    of the two approvals it needs: the drain, the end asked for and the extended plan's hash."""
    drain = Drain(db)
    to = later(30)
    drain.extend(ada, to)
    digest = plan_hash(extended_plan(drain.plan, to))
    drain.approve(bob)
    return drain, to, digest


def test_the_last_approval_moves_the_end_writes_the_hold_extension_audits_and_tells_the_thread(db):
    drain, to, digest = approved_once_of_two(db)
    last = APPROVED + dt.timedelta(minutes=5)

    view = drain.approve(cat, at=last)

    assert (view.state, view.window_end, view.plan_hash, view.extension) == ("running", to, digest, None)
    assert view.plan == extended_plan(drain.plan, to)
    assert HoldExtension.read_from(step_params(drain.hold()), kind="hold") == HoldExtension(
        extended_until=to, extended_at=last, extended_by="U0CAT")
    assert drain.audited("request.extended") == [{
        "at": last, "actor": "U0CAT", "k8s_identity": None, "action": "request.extended", "target": "serve-b",
        "request_id": drain.id, "run_id": None, "before": "running", "after": "running",
        "detail": {"old_window_end": "2026-12-05T03:00:00.000000Z", "window_end": "2026-12-05T03:30:00.000000Z",
                   "old_plan_hash": plan_hash(drain.plan), "plan_hash": digest, "asked_by": "U0ADA",
                   "approvers": ["U0BOB", "U0CAT"], "run_id": drain.run_id, "nodes": ["gpu-01"]}}]
    text = say.thread_extended_running(request_id=drain.id, window_end=END, extended_to=to, approvers=["Bob", "Cat"],
                                       zone=BERLIN)
    assert drain.thread("request.extended") == [{
        "channel": "C0OPS", "thread_ts": THREAD, "kind": "post", "dedupe_key": f"{drain.id}/extended-running/{digest}",
        "payload": {"event": "request.extended", "request_id": drain.id, "pool": "serve-b", "kind": "drain",
                    "state": "running", "text": text, "people": ["U0ADA", "U0BOB", "U0CAT"]}}]
    assert "now ends 2026-12-05 04:30:00 CET (was 2026-12-05 04:00:00 CET; approved by Bob and Cat)" in text
    assert len(drain.audited("request.extension_approval")) == 1  # the last approval is told as the extension


def test_on_a_pool_needing_no_approval_the_one_who_asked_is_who_extended_the_hold(db):
    drain = Drain(db, "train-a")
    to = later(45)

    drain.extend(ada, to)

    assert HoldExtension.read_from(step_params(drain.hold()), kind="hold") == HoldExtension(
        extended_until=to, extended_at=ASKED, extended_by="U0ADA")
    (row,) = drain.audited("request.extended")
    assert (row["actor"], row["detail"]["approvers"], row["detail"]["asked_by"]) == ("U0ADA", [], "U0ADA")
    assert drain.audited("request.extension_asked")[0]["detail"]["approvals_required"] == 0
    assert drain.thread("request.extension_asked") == []


def test_the_last_approval_of_a_run_whose_hold_was_ended_meanwhile_is_refused_and_changes_nothing(db):
    drain = Drain(db)
    drain.extend(ada, later(30))
    drain.approve(bob)
    halfway = drain.get().extension
    RunService(db).release_hold(ada, drain.id, now=APPROVED)

    reason, code = refusal(lambda: drain.approve(cat))

    assert (reason, code) == (say.extend_released(drain.id), RefusalCode.NOT_HOLDING)
    after = drain.get()
    assert (after.window_end, after.plan_hash, after.extension) == (END, plan_hash(drain.plan), halfway)
    assert drain.audited("request.extended") == [] and drain.thread("request.extended") == []


# ------------------------------------------------------------------ lapsed


def lapsed_post(drain: Drain, *, to: dt.datetime, digest: str) -> dict[str, Any]:
    return {"channel": "C0OPS", "thread_ts": THREAD, "kind": "post",
            "dedupe_key": f"{drain.id}/extension-lapsed/{digest}",
            "payload": {"event": "request.extension_lapsed", "request_id": drain.id, "pool": "serve-b",
                        "kind": "drain", "state": "running", "people": ["U0ADA"],
                        "text": say.extension_lapsed(drain.id, window_end=END, extended_to=to, zone=BERLIN)}}


def test_an_approval_at_the_deadline_is_too_late_the_extension_lapses_audited_and_told_in_full(db):
    drain, to, digest = approved_once_of_two(db)

    reason, code = refusal(lambda: drain.approve(cat, at=END))

    assert (reason, code) == (say.extension_lapsed(drain.id, window_end=END, extended_to=to, zone=BERLIN),
                              RefusalCode.EXPIRED)
    assert drain.audited("request.extension_lapsed") == [{
        "at": END, "actor": "gpuops", "k8s_identity": None, "action": "request.extension_lapsed",
        "target": "serve-b", "request_id": drain.id, "run_id": None, "before": "running", "after": "running",
        "detail": {"window_end": "2026-12-05T03:00:00.000000Z", "extended_to": "2026-12-05T03:30:00.000000Z",
                   "plan_hash": digest, "approvals_counted": 1, "approvals_required": 2}}]
    assert drain.thread("request.extension_lapsed") == [lapsed_post(drain, to=to, digest=digest)]
    assert "(2026-12-05 04:00:00 CET)" in reason
    drain.untouched()


def test_a_second_before_the_deadline_the_last_approval_still_applies(db):
    drain = Drain(db)
    to = later(30)
    drain.extend(ada, to)
    drain.approve(bob)

    view = drain.approve(cat, at=END - dt.timedelta(seconds=1))

    assert (view.window_end, view.extension) == (to, None)
    assert drain.audited("request.extension_lapsed") == []


def test_the_sweep_lets_an_extension_lapse_at_its_request_ttl_saying_the_drains_own_end(db):
    drain = Drain(db, config=settings(ttl="20m"))
    to = later(30)
    drain.extend(ada, to)
    digest = plan_hash(extended_plan(drain.plan, to))
    deadline = ASKED + dt.timedelta(minutes=20)

    drain.service().expire_due(deadline - dt.timedelta(seconds=1))
    assert drain.get().extension is not None
    drain.service().expire_due(deadline)

    assert drain.get().extension is None and drain.get().window_end == END
    (row,) = drain.audited("request.extension_lapsed")
    assert (row["at"], row["detail"]["window_end"], row["detail"]["approvals_counted"]) == (
        deadline, "2026-12-05T03:00:00.000000Z", 0)
    (post,) = drain.thread("request.extension_lapsed")
    assert post["dedupe_key"] == f"{drain.id}/extension-lapsed/{digest}"
    # The drain keeps its own end (04:00 in Berlin), not the deadline the extension lapsed at (03:30).
    assert "04:00:00 CET" in post["payload"]["text"] and "03:30:00 CET" not in post["payload"]["text"]


def test_a_lapse_after_the_pools_rule_was_tightened_audits_the_number_required_now(db):
    drain = Drain(db)
    drain.extend(ada, later(30))

    drain.service(settings(serve_b=3)).expire_due(END)

    (row,) = drain.audited("request.extension_lapsed")
    assert (row["detail"]["approvals_counted"], row["detail"]["approvals_required"]) == (0, 3)


# ------------------------------------------------------------------ another replica wrote meanwhile


class Meanwhile:
    """The role lookup (which may ask Slack, and take a while) during which another replica
    writes: `write` runs once, the first time `who` is looked up."""

    def __init__(self, config: GpuopsConfig, who: str, write: Callable[[], object]) -> None:
        self.config, self.who, self.write = config, who, write
        self.written = False

    def __call__(self, user_id: str) -> Actor:
        if user_id == self.who and not self.written:
            self.written = True
            self.write()
        return self.config.actor(user_id)


class PoolsMeanwhile:
    """The configuration, whose pools being read is when another replica writes (once)."""

    def __init__(self, config: GpuopsConfig, write: Callable[[], object]) -> None:
        self._config, self._write = config, write
        self.names, self.cluster_name, self.engine = config.names, config.cluster_name, config.engine
        self.display_zone = config.display_zone

    @property
    def pools(self) -> Mapping[str, Any]:
        write, self._write = self._write, lambda: None
        write()
        return self._config.pools

    def actor(self, user_id: str) -> Actor:
        return self._config.actor(user_id)


def test_an_ask_that_loses_to_the_run_ending_meanwhile_says_the_request_changed(db):
    drain = Drain(db)
    fails = PoolsMeanwhile(CONFIG, lambda: stored_requests.transition(db, id=RequestId(drain.id),
                                                                      expected="running", new="failed", at=ASKED))
    to = later(30)

    reason, code = refusal(lambda: RequestService(db, fails).extend_running(
        ada, drain.id, extended_plan(drain.plan, to), window_end=to, now=ASKED))

    assert (reason, code) == (say.changed_meanwhile(drain.id), RefusalCode.CHANGED_MEANWHILE)


def asks_again(drain: Drain, to: dt.datetime) -> Callable[[], object]:
    """Ada's new ask for `to`, stored by another replica."""
    plan = extended_plan(drain.plan, to)
    return lambda: stored_requests.ask_extension(
        drain.db, id=RequestId(drain.id), expected_plan_hash=plan_hash(drain.plan), window_end=to,
        plan=plan_to_json(plan), plan_hash=plan_hash(plan), asked_by="U0ADA", expires_at=END, at=APPROVED)


def test_a_last_approval_that_loses_to_a_new_ask_meanwhile_says_the_request_changed(db):
    drain = Drain(db)
    drain.extend(ada, later(30))
    drain.approve(bob)

    gus = CONFIG.actor("U0GUS")  # looked up for the first time as his approval is counted

    reason, code = refusal(lambda: drain.approve(gus, roles=Meanwhile(CONFIG, "U0GUS", asks_again(drain, later(45)))))

    assert (reason, code) == (say.changed_meanwhile(drain.id), RefusalCode.CHANGED_MEANWHILE)
    assert drain.get().window_end == END


def test_a_lapse_that_loses_to_a_new_ask_meanwhile_says_the_request_changed(db):
    drain = Drain(db)
    drain.extend(ada, later(30))
    drain.approve(bob)
    sweep = drain.service(roles=Meanwhile(CONFIG, "U0BOB", asks_again(drain, later(45))))

    reason, code = refusal(lambda: sweep.expire_due(END))

    assert (reason, code) == (say.changed_meanwhile(drain.id), RefusalCode.CHANGED_MEANWHILE)


def test_an_approver_whose_earlier_approval_no_longer_counts_and_approves_again_hears_the_request_changed(db):
    # Bob's first approval is stored, but the role lookup (Slack's user groups) no longer
    # counts it while the Bob who clicks still holds the role: his second one cannot be stored.
    drain = Drain(db)
    drain.extend(ada, later(30))
    drain.approve(bob)
    not_bob = {"U0BOB": CONFIG.actor("U0FRED")}

    reason, code = refusal(lambda: drain.approve(bob, roles=lambda u: not_bob.get(u) or CONFIG.actor(u)))

    assert (reason, code) == (say.changed_meanwhile(drain.id), RefusalCode.CHANGED_MEANWHILE)
