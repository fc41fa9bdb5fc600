"""Starting and controlling runs through `RunService` on a real SQLite file: only an
approved (or scheduled) request whose plan is the approved one starts, decided on what
is stored when the start commits; only operators of the run's pool (and admins) pause,
resume and abort it."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterator

import pytest

from storage import audit, codec
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.database import Database, open_database
from storage.ids import RequestId
from workflows.access import AccessDenied, Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunRefused, RunService
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave, plan_hash, plan_to_json
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

UTC = dt.timezone.utc
NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=UTC)
MINUTE = dt.timedelta(minutes=1)

def _config(serving_a: dict | None = None, *, bob: str = "approver") -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        # train-a drains need no approval; serving-a drains need one, from bob.
        "pools": {"train-a": {"kind": "training", "windows": "always"},
                  "serving-a": {"kind": "serving", "windows": "always", "approvers": ["U0BOB"], **(serving_a or {})}},
        "access": {"users": {"U0ADA": ["operator"], "U0BOB": [bob], "U0CAT": ["approver"], "U0DAN": ["admin"],
                             "U0EVE": ["viewer"]},
                   "names": {"U0ADA": "Ada", "U0BOB": "Bob", "U0CAT": "Cat", "U0DAN": "Dan", "U0EVE": "Eve"}},
    })


CONFIG = _config()
ada, bob, dan, eve = (CONFIG.actor(u) for u in ("U0ADA", "U0BOB", "U0DAN", "U0EVE"))


def pool_operator(pool: str) -> Actor:
    return Actor(user_id=UserId("U0POOL"), name="Pat", pool_roles={pool: frozenset({Role.OPERATOR})})


def drain_plan(pool: str, *, hours: int = 1, nodes: tuple[str, ...] = ("gpu-01",)) -> Plan:
    steps = tuple(step for node in nodes for step in (
        NodeStep("cordon", NodeName(node), {}), NodeStep("evict", NodeName(node), {"scope": "all-non-daemonset"}),
        NodeStep("hold", NodeName(node), {"seconds": hours * 3600}), NodeStep("uncordon", NodeName(node), {})))
    return Plan(kind="drain", pool=pool, waves=(Wave(0, tuple(NodeName(n) for n in nodes), steps),),
                summary=PlanSummary(), created_for="U0ADA")


def submit(db: Database, pool: str, plan: Plan | None = None) -> RequestView:
    plan = plan or drain_plan(pool)
    return RequestService(db, CONFIG).submit(ada, kind="drain", pool=pool, targets=list(plan.nodes), plan=plan,
                                             window_start=None, window_end=None, reason="rack move",
                                             channel="C0OPS", now=NOW)


def runs_of(db: Database) -> RunService:
    """Runs as the bot makes them: approvals counted with roles and rules as they are now."""
    return RunService(db, requests=RequestService(db, CONFIG))


def run_rows(db: Database, request_id: str) -> list[stored_runs.Run]:
    return stored_runs.for_request(db, request_id=RequestId(request_id))


def created_rows(db: Database) -> list[audit.AuditEntry]:
    return [e for e in audit.recent(db, 100) if e.action == "run.created"]


# ------------------------------------------------------------------ start


def test_an_approved_request_starts_a_pending_run_of_exactly_its_plans_steps(db):
    request = submit(db, "train-a", drain_plan("train-a", nodes=("gpu-01", "gpu-02")))

    view = runs_of(db).start(request.id, dry_run=False, now=NOW, actor=ada)

    assert view.state == "pending" and RequestService(db, CONFIG).get(request.id).state == "running"
    assert [(s.node, s.seq, s.kind, s.detail) for s in view.steps] == [
        (step.node, seq, step.kind, {"params": dict(step.params)})
        for node in ("gpu-01", "gpu-02")
        for seq, step in enumerate(s for s in request.plan.waves[0].steps if s.node == node)]
    (created,) = created_rows(db)
    assert (created.actor, created.run_id, created.detail["plan_hash"]) == ("U0ADA", view.id, request.plan_hash)


def test_a_start_records_who_started_which_plan_and_tells_the_requests_thread(db):
    request = submit(db, "train-a", drain_plan("train-a", nodes=("gpu-01", "gpu-02")))

    view = runs_of(db).start(request.id, dry_run=True, now=NOW + MINUTE, actor=ada)

    (created,) = created_rows(db)
    assert (created.actor, created.action, created.target, created.request_id, created.run_id,
            created.before, created.after, created.at) == (
        "U0ADA", "run.created", "train-a", request.id, view.id, "approved", "running", NOW + MINUTE)
    assert created.detail == {"dry_run": True, "plan_hash": request.plan_hash, "nodes": ["gpu-01", "gpu-02"],
                              "waves": 1}
    (message,) = [m for m in outbox_rows(db) if m["payload"]["event"] == "run.created"]
    assert (message["channel"], message["kind"], message["dedupe_key"]) == ("C0OPS", "post", f"{view.id}/created")
    assert message["payload"] == {"event": "run.created", "request_id": request.id, "run_id": view.id,
                                  "pool": "train-a", "kind": "drain", "state": "pending",
                                  "text": f"Dry run {view.id} of {request.id} is queued for the engine",
                                  "people": []}  # the text names nobody gpuops should mention
    # The scheduler starts runs as gpuops.
    other = submit(db, "train-a")
    runs_of(db).start(other.id, dry_run=False, now=NOW, plan_hash=other.plan_hash)
    assert [e.actor for e in created_rows(db)] == ["gpuops", "U0ADA"]


def outbox_rows(db: Database) -> list[dict]:
    return [{**row, "payload": json.loads(row["payload"])} for row in db.query("SELECT * FROM outbox ORDER BY id")]


def test_the_start_refusals_name_the_request(db):
    pending, approved = submit(db, "serving-a"), submit(db, "train-a")

    with pytest.raises(RunRefused) as not_approved:
        runs_of(db).start(pending.id, dry_run=False, now=NOW)
    with pytest.raises(RunRefused) as stale:
        runs_of(db).start(approved.id, dry_run=False, now=NOW, plan_hash="0" * 64)

    assert str(not_approved.value) == f"{pending.id} is pending: only an approved or scheduled request can start a run"
    assert str(stale.value) == (f"{approved.id}'s plan changed (hash 00000000 is now {approved.short_hash}) since the "
                                "start was decided: not started; it starts once its current plan is approved")


def test_an_approved_request_that_already_has_an_unfinished_run_gets_no_second_one(db):
    request = submit(db, "train-a")
    assert stored_runs.create(db, request_id=RequestId(request.id), dry_run=False, at=NOW) is not None

    with pytest.raises(RunRefused) as refused:
        runs_of(db).start(request.id, dry_run=False, now=NOW)

    assert str(refused.value) == f"{request.id} already has a run in progress"
    assert len(run_rows(db, request.id)) == 1 and created_rows(db) == []
    assert RequestService(db, CONFIG).get(request.id).state == "approved"


def test_a_request_that_changes_inside_the_starting_transaction_starts_nothing(db):
    request = submit(db, "train-a")
    # What the compare-and-set guards against: the request moving between the read and the
    # transition (a trigger makes it happen inside the one transaction).
    db.execute("CREATE TEMP TRIGGER meanwhile AFTER INSERT ON runs BEGIN "
               "UPDATE requests SET state = 'cancelled' WHERE id = NEW.request_id; END")

    with pytest.raises(RunRefused) as refused:
        runs_of(db).start(request.id, dry_run=False, now=NOW)

    assert str(refused.value) == f"{request.id} is changing: only an approved or scheduled request can start a run"
    db.execute("DROP TRIGGER meanwhile")
    assert run_rows(db, request.id) == [] and RequestService(db, CONFIG).get(request.id).state == "approved"


@pytest.mark.parametrize("state", ["pending", "denied", "cancelled", "expired", "running", "done", "failed", "missed"])
def test_a_request_that_is_not_approved_or_scheduled_starts_no_run_and_stays_as_it_is(db, state):
    request = submit(db, "serving-a")  # pending: bob has not approved
    if state != "pending":
        assert stored_requests.transition(db, id=request.id, expected="pending", new=state, at=NOW)  # type: ignore[arg-type]

    with pytest.raises(RunRefused, match=f"^{request.id} is {state}: only an approved or scheduled request can start a run$"):
        runs_of(db).start(request.id, dry_run=False, now=NOW)

    assert run_rows(db, request.id) == [] and created_rows(db) == []
    assert RequestService(db, CONFIG).get(request.id).state == state


def test_a_scheduled_request_starts_like_an_approved_one(db):
    request = submit(db, "train-a")
    assert stored_requests.transition(db, id=request.id, expected="approved", new="scheduled", at=NOW)

    assert runs_of(db).start(request.id, dry_run=True, now=NOW).state == "pending"


def test_an_approved_request_whose_approvals_do_not_reach_the_number_it_needs_is_not_started(db):
    request = submit(db, "serving-a")
    # Approved in storage without bob's approval (a bug or a hand edit): the start counts again.
    assert stored_requests.transition(db, id=request.id, expected="pending", new="approved", at=NOW)

    with pytest.raises(RunRefused, match=f"^{request.id}'s plan {request.short_hash} has 0 of the 1 approvals it needs: not started$"):
        runs_of(db).start(request.id, dry_run=False, now=NOW)

    assert run_rows(db, request.id) == []


def test_an_approver_removed_after_approving_no_longer_counts_when_the_run_starts(db):
    request = submit(db, "serving-a")
    RequestService(db, CONFIG).approve(bob, request.id, plan_hash=request.plan_hash, now=NOW)
    # Bob is no longer an approver when the run starts (the configuration reloaded).
    now_config = _config({"approvers": ["U0CAT"]}, bob="viewer")
    runs = RunService(db, requests=RequestService(db, now_config))

    with pytest.raises(RunRefused, match="has 0 of the 1 approvals it needs: not started$"):
        runs.start(request.id, dry_run=False, now=NOW + MINUTE)

    assert run_rows(db, request.id) == []
    view = RequestService(db, now_config).get(request.id)
    assert view.state == "pending" and view.approvals_counted == 0  # back to the approvers
    (reopened,) = [e for e in audit.recent(db, 100) if e.action == "request.reopened"]
    assert (reopened.actor, reopened.before, reopened.after) == ("gpuops", "approved", "pending")
    assert reopened.detail == {"plan_hash": request.plan_hash, "approvals_counted": 0, "approvals_required": 1,
                               "no_longer_approvers": ["U0BOB"]}
    (told,) = [m for m in outbox_rows(db) if m["payload"]["event"] == "request.reopened"]
    said = told["payload"]["text"]
    assert said.startswith(f"The run of {request.id} did not start: Bob no longer holds the approver role") and \
        "0 of 1 count" in said, said
    # Bob is told (mentioned) as well as the requester; the card's state is pending again.
    assert (told["payload"]["state"], told["payload"]["people"]) == ("pending", sorted({request.requester, "U0BOB"}))
    assert told["dedupe_key"] == f"{request.id}/reopened/{request.plan_hash}/0/1"


def test_a_rule_made_stricter_after_approval_holds_back_the_run_until_it_is_met(db):
    one = _config({"approvers": ["U0BOB", "U0CAT"]})
    request = submit(db, "serving-a")
    RequestService(db, one).approve(bob, request.id, plan_hash=request.plan_hash, now=NOW)
    assert RequestService(db, one).get(request.id).state == "approved"
    # The pool now asks for two approvals of a drain.
    two = _config({"approvers": ["U0BOB", "U0CAT"], "approvals": {"drain": 2}})
    runs = RunService(db, requests=RequestService(db, two))

    with pytest.raises(RunRefused, match="has 1 of the 2 approvals it needs: not started$"):
        runs.start(request.id, dry_run=False, now=NOW + MINUTE)
    assert RequestService(db, two).get(request.id).state == "pending"

    cat = two.actor("U0CAT")
    RequestService(db, two).approve(cat, request.id, plan_hash=request.plan_hash, now=NOW + 2 * MINUTE)
    assert runs.start(request.id, dry_run=False, now=NOW + 3 * MINUTE).state == "pending"  # the run is queued


def test_a_run_service_that_cannot_read_roles_starts_no_run_that_needs_approvals(db):
    request = submit(db, "serving-a")
    RequestService(db, CONFIG).approve(bob, request.id, plan_hash=request.plan_hash, now=NOW)

    with pytest.raises(RunRefused, match="cannot read who holds the approver role now"):
        RunService(db).start(request.id, dry_run=False, now=NOW + MINUTE)
    assert run_rows(db, request.id) == []
    # One that needs none starts as before.
    assert RunService(db).start(submit(db, "train-a").id, dry_run=False, now=NOW).state == "pending"


def test_a_stored_plan_that_no_longer_hashes_to_its_approved_hash_is_not_started(db):
    request = submit(db, "serving-a")
    RequestService(db, CONFIG).approve(bob, request.id, plan_hash=request.plan_hash, now=NOW)
    other = drain_plan("serving-a", hours=8)
    with db.transaction():  # the plan text changed under the approvals
        db.execute("UPDATE requests SET plan = ? WHERE id = ?", (codec.json_to_text(plan_to_json(other)), request.id))

    with pytest.raises(RunRefused, match=f"^{request.id}'s stored plan no longer hashes to {request.short_hash}, the plan its approvals name"):
        runs_of(db).start(request.id, dry_run=False, now=NOW)

    assert run_rows(db, request.id) == []


def test_a_re_plan_after_the_scheduler_read_the_request_refuses_the_start_of_the_old_plan(db):
    request = submit(db, "train-a")  # approved at once: train-a drains need no approval
    seen = RequestService(db, CONFIG).get(request.id)  # what the scheduler decided on
    longer = drain_plan("train-a", hours=3)
    RequestService(db, CONFIG).extend_window(ada, request.id, longer, window_end=None, now=NOW + MINUTE)

    with pytest.raises(RunRefused, match=f"plan changed \\(hash {seen.short_hash} is now "
                                         f"{plan_hash(longer)[:8]}\\)"):
        runs_of(db).start(request.id, dry_run=False, now=NOW + MINUTE, plan_hash=seen.plan_hash)

    assert run_rows(db, request.id) == []
    # The next tick reads the request again and starts the plan that is approved now.
    view = runs_of(db).start(request.id, dry_run=False, now=NOW + 2 * MINUTE, plan_hash=plan_hash(longer))
    assert view.steps[2].detail == {"params": {"seconds": 3 * 3600}}


class _WriteLandsFirst(Database):
    """The database as the start sees it when another writer commits just before the
    start's transaction begins (what a `drain extend` racing the scheduler does)."""

    def __init__(self, db: Database, landing: Callable[[], None]) -> None:
        super().__init__(db.backend)
        self._landing: Callable[[], None] | None = landing

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        if self._landing is not None and not self.in_transaction:
            landing, self._landing = self._landing, None
            landing()
        with super().transaction() as db:
            yield db


def test_the_start_decides_on_the_request_as_it_is_when_the_start_commits(db, tmp_path):
    request = submit(db, "train-a")
    longer = drain_plan("train-a", hours=3)

    def extend() -> None:
        with open_database(db.path) as other:
            RequestService(other, CONFIG).extend_window(ada, request.id, longer, window_end=None, now=NOW)

    view = RunService(_WriteLandsFirst(db, extend)).start(request.id, dry_run=False, now=NOW + MINUTE)

    # The new plan runs (approved at once on this pool), never the one read before the extend.
    assert view.steps[2].detail == {"params": {"seconds": 3 * 3600}}
    assert [e.detail["plan_hash"] for e in created_rows(db)] == [plan_hash(longer)]


def test_a_cancel_that_lands_just_before_the_start_commits_starts_nothing(db):
    request = submit(db, "train-a")

    def cancel() -> None:
        with open_database(db.path) as other:
            RequestService(other, CONFIG).cancel(ada, request.id, now=NOW)

    with pytest.raises(RunRefused, match=f"^{request.id} is cancelled"):
        RunService(_WriteLandsFirst(db, cancel)).start(request.id, dry_run=False, now=NOW + MINUTE)

    assert run_rows(db, request.id) == []


@pytest.mark.parametrize("who", [bob, eve, pool_operator("serving-a")], ids=["approver", "viewer", "other-pool"])
def test_only_an_operator_of_the_pool_may_start_a_run_by_hand(db, who):
    request = submit(db, "train-a")

    with pytest.raises(AccessDenied, match="Starting a run needs the operator role for pool train-a"):
        runs_of(db).start(request.id, dry_run=False, now=NOW, actor=who)

    assert run_rows(db, request.id) == []
    assert runs_of(db).start(request.id, dry_run=False, now=NOW, actor=pool_operator("train-a")).state == "pending"


# ------------------------------------------------------------------ pause, resume, abort


def _controls(service: RunService, who: Actor, run_id: str) -> dict[str, str]:
    """Pause, resume and abort in turn; what each did (the run's state) or why not."""
    outcome = {}
    for name in ("pause", "resume", "abort"):
        try:
            outcome[name] = getattr(service, name)(who, run_id, now=NOW + MINUTE).state
        except AccessDenied as err:
            outcome[name] = str(err)
    return outcome


@pytest.mark.parametrize("who", [ada, dan, pool_operator("train-a")], ids=["operator", "admin", "pool-operator"])
def test_an_operator_of_the_runs_pool_or_an_admin_pauses_resumes_and_aborts_it(db, who):
    run = runs_of(db).start(submit(db, "train-a").id, dry_run=False, now=NOW)

    assert _controls(runs_of(db), who, run.id) == {"pause": "paused", "resume": "running", "abort": "aborted"}
    assert [e.action for e in audit.for_run(db, run.id)] == ["run.created", "run.paused", "run.resumed",
                                                            "run.aborted"]


@pytest.mark.parametrize("who, held", [(bob, "approver, viewer"), (eve, "viewer"), (pool_operator("serving-a"), "no role")],
                         ids=["approver", "viewer", "other-pool"])
def test_anyone_else_is_refused_every_control_and_the_run_is_left_as_it_was(db, who, held):
    run = runs_of(db).start(submit(db, "train-a").id, dry_run=False, now=NOW)

    refused = _controls(runs_of(db), who, run.id)

    assert refused == {name: f"A run being {done} needs the operator role for pool train-a; {who.name} has {held}"
                       for name, done in (("pause", "paused"), ("resume", "resumed"), ("abort", "aborted"))}
    assert stored_runs.get(db, id=run.id).state == "pending"  # type: ignore[union-attr]
    assert [e.action for e in audit.for_run(db, run.id)] == ["run.created"]


class _Host:
    """What the scheduler's window-start job needs, on one connection."""

    def __init__(self, db: Database) -> None:
        self.config, self.fleet, self.db, self.notified = CONFIG, None, db, 0
        self.clusters = None  # one cluster

    @property
    def database(self) -> _Host:
        return self

    def get(self) -> Database:
        return self.db

    def notify(self) -> None:
        self.notified += 1

    def roles_in(self, config):
        return None  # the configuration alone


def test_the_scheduler_starts_only_the_plan_it_read_and_a_re_plan_meanwhile_waits_for_the_next_tick(db):
    from bot.scheduler import start_window_runs

    request = submit(db, "train-a")
    longer = drain_plan("train-a", hours=3)

    def extend() -> None:
        with open_database(db.path) as other:
            RequestService(other, CONFIG).extend_window(ada, request.id, longer, window_end=None, now=NOW)

    start_window_runs(_Host(_WriteLandsFirst(db, extend)), NOW + MINUTE)  # type: ignore[arg-type]
    assert run_rows(db, request.id) == []

    start_window_runs(_Host(db), NOW + 2 * MINUTE)  # type: ignore[arg-type]
    assert len(run_rows(db, request.id)) == 1
    assert [e.detail["plan_hash"] for e in created_rows(db)] == [plan_hash(longer)]


def test_a_paused_run_can_be_aborted_and_a_finished_one_cannot_be_controlled(db):
    run = runs_of(db).start(submit(db, "train-a").id, dry_run=False, now=NOW)
    runs_of(db).pause(ada, run.id, now=NOW)

    assert runs_of(db).abort(ada, run.id, now=NOW).state == "aborted"
    with pytest.raises(RunRefused):
        runs_of(db).resume(ada, run.id, now=NOW)
