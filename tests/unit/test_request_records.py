"""What every task of the request service stands on (workflows.requests.records), as the
audit log, the request's thread and whoever reads a request see it:

- the open requests listed are this cluster's, or with `every_cluster` those of every
  cluster sharing the database, up to five hundred of them;
- the runs a pool's nodes come back from are the unfinished runs of its running requests,
  this cluster's only, each with its request's window end;
- a pool's pace is read from this cluster's past runs only;
- someone the configuration does not name and who is no Slack user (the command line) is
  named by the name they came with, in the thread and when the request is read back;
- the approvers of an unknown request are no one; for a known one, everyone who decided
  is looked up (Slack may be asked) before the write lock is taken, once;
- an unknown id suggests the three closest ids;
- a pending request touched after its deadline expires: gpuops audits it with the deadline,
  the plan and the approvals counted and required by the pool's rule as it is now, and its
  thread hears it once;
- a change one Slack delivery made is found again by that delivery only, and for that
  action only;
- a request reads back the Slack thread that tells its story;
- a plan built for someone other than the requester, a window that ends as it starts, and
  a plan whose window differs from the request's are programming errors, saying which.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.database import Database
from storage.ids import RequestId, RunId
from storage.requests import Request
from test_request_submitting import last_audit, last_told
from test_requests import CONFIG, CONFIG_DATA, CHANNEL, HOUR, START, a_plan, ada, bob, carol, service, submit  # noqa: F401
from tests.unit.test_preflight_pace_commands import MIN, _a_past_run
from workflows.access import Actor
from workflows.config import GpuopsConfig
from workflows.plans import plan_hash, plan_to_json
from workflows.requests.errors import RequestRefused, UnknownRequest
from workflows.requests.service import RequestService

# The same pools, as the configurations of two clusters whose gpuops share one database.
EAST = GpuopsConfig.model_validate({**CONFIG_DATA, "cluster": {"name": "east"}})
WEST = GpuopsConfig.model_validate({**CONFIG_DATA, "cluster": {"name": "west"}})
WINDOW_END = START + 16 * HOUR


def a_running_drain(db: Database, *, pool: str = "train-a", cluster: str | None = "east",
                    window_end: dt.datetime | None = WINDOW_END) -> Request:
    """A drain of `pool` that gpuops of `cluster` is running (its runs are the caller's)."""
    plan = a_plan("drain", pool=pool)
    request = stored_requests.create(
        db, kind="drain", pool=pool, targets=["gpu-01", "gpu-02"], window_start=START, window_end=window_end,
        reason="rack move", requester="U0ADA", requester_name="Ada", plan=plan_to_json(plan),
        plan_hash=plan_hash(plan), approvals_required=0, expires_at=START + 24 * HOUR, at=START, cluster=cluster)
    assert stored_requests.transition(db, id=request.id, expected="pending", new="running", at=START)
    return request


def a_run(db: Database, request: Request, *, dry_run: bool = False, finished: bool = False) -> RunId:
    run = stored_runs.create(db, request_id=request.id, dry_run=dry_run, at=START)
    assert run is not None
    if finished:
        assert stored_runs.transition(db, id=run.id, expected="pending", new="succeeded", at=START + HOUR)
    return run.id


# ------------------------------------------------------------------ listing


def test_a_cluster_lists_its_own_open_requests_and_with_every_cluster_those_of_all_sharing_its_database(db):
    east = RequestService(db, EAST)
    ours, theirs = submit(east), submit(RequestService(db, WEST))

    assert [v.id for v in east.open_requests()] == [ours.id]
    assert {v.id for v in east.open_requests(every_cluster=True)} == {ours.id, theirs.id}


def test_more_than_a_hundred_running_drains_are_all_listed_with_all_their_runs(db):
    with db.transaction():
        running = [a_running_drain(db) for _ in range(101)]
        runs = [a_run(db, request) for request in running]

    east = RequestService(db, EAST)

    assert len(east.open_requests("train-a")) == 101
    assert east.runs_ending("train-a") == {str(run): WINDOW_END for run in runs}


def test_a_pools_nodes_come_back_from_the_unfinished_runs_of_this_clusters_running_requests_at_their_window_end(db):
    ours = a_running_drain(db)
    a_run(db, ours, dry_run=True, finished=True)
    live = a_run(db, ours)
    a_run(db, a_running_drain(db, pool="serving-a"))  # another pool
    a_run(db, a_running_drain(db, cluster="west"))  # another cluster's gpuops
    a_run(db, a_running_drain(db, cluster=None))  # a request that names no cluster

    assert RequestService(db, EAST).runs_ending("train-a") == {str(live): WINDOW_END}


def test_a_pools_pace_is_read_from_this_clusters_past_runs_only(db):
    _a_past_run(db, pool="train-a", at=START - 48 * HOUR, took={"drain": 50})
    stored_requests.name_unnamed_cluster(db, cluster="west")
    _a_past_run(db, pool="train-a", at=START - 24 * HOUR, took={"drain": 5})
    stored_requests.name_unnamed_cluster(db, cluster="east")

    pace = RequestService(db, EAST).pool_pace("train-a")

    assert sorted((s.node, s.kind, s.took) for s in pace.steps) == [("t1", "drain", 5 * MIN),
                                                                     ("t2", "drain", 5 * MIN)]


# ------------------------------------------------------------------ naming people


def test_someone_on_the_command_line_the_configuration_does_not_name_is_named_by_the_name_they_came_with(db):
    access = {**CONFIG_DATA["access"], "users": {**CONFIG_DATA["access"]["users"], "ada": ["operator"]}}
    console = GpuopsConfig.model_validate({**CONFIG_DATA, "access": access})
    requests = RequestService(db, console)
    lovelace = console.actor("ada", name="Ada Lovelace", via="console")

    view = submit(requests, lovelace, kind="drain", pool="train-a",
                  plan=a_plan("drain", pool="train-a", created_for="ada"))

    _, told = last_told(db)
    assert told["text"].startswith(f"{view.id}: Ada Lovelace requested a drain on pool train-a")
    assert view.requester_name == "Ada Lovelace"
    assert requests.get(view.id).requester_name == "Ada Lovelace"


# ------------------------------------------------------------------ who approves now


class RoleLookups:
    """The role lookup (which may ask Slack for a user group's members): who was looked up."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, user_id: str) -> Actor:
        self.asked.append(user_id)
        return CONFIG.actor(user_id)


def test_no_one_approves_a_request_that_does_not_exist(service):  # noqa: F811
    assert service.approvers_looked_up("req-nope00")("U0BOB") is False


def test_everyone_who_decided_is_looked_up_once_before_the_transaction(db, service):  # noqa: F811
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    service.deny(carol, view.id, reason="capacity floor", now=START)
    lookups = RoleLookups()

    approver_now = RequestService(db, CONFIG, roles=lookups).approvers_looked_up(view.id)

    assert lookups.asked == ["U0BOB", "U0CAROL"]
    assert (approver_now("U0BOB"), approver_now("U0CAROL"), approver_now("U0ADA")) == (True, True, False)
    assert lookups.asked == ["U0BOB", "U0CAROL", "U0ADA"]


# ------------------------------------------------------------------ reading


def test_an_unknown_id_suggests_the_three_closest_ids(db, service):  # noqa: F811
    plan = a_plan()
    for digit in "1234":
        stored_requests.create(
            db, kind="upgrade", pool="serving-a", targets=["gpu-01"], window_start=None, window_end=None,
            reason="r", requester="U0ADA", requester_name="Ada", plan=plan_to_json(plan), plan_hash=plan_hash(plan),
            approvals_required=2, expires_at=START + HOUR, at=START, id=RequestId(f"req-abc00{digit}"))

    with pytest.raises(UnknownRequest) as unknown:
        service.get("req-abc000")

    assert str(unknown.value) == "There is no request req-abc000; did you mean req-abc004 or req-abc003 or req-abc002?"


def test_a_request_reads_back_the_slack_thread_that_tells_its_story(db, service):  # noqa: F811
    view = submit(service)
    assert stored_requests.set_thread(db, id=RequestId(view.id), channel=CHANNEL, thread_ts="1749297600.000100")

    assert (service.get(view.id).channel, service.get(view.id).thread_ts) == (CHANNEL, "1749297600.000100")


def test_a_plan_built_for_someone_other_than_the_requester_is_a_programming_error_naming_both(service):  # noqa: F811
    with pytest.raises(ValueError, match="^the plan was built for U0BOB, not U0ADA$"):
        submit(service, plan=a_plan(created_for="U0BOB"))


def test_a_request_window_that_ends_as_it_starts_is_a_programming_error_and_nothing_is_stored(service):  # noqa: F811
    at = START + 14 * HOUR

    with pytest.raises(ValueError, match="^the request window must end after it starts$"):
        service.submit(ada, kind="upgrade", pool="serving-a", targets=["gpu-01", "gpu-02"], plan=a_plan(),
                       window_start=at, window_end=at, reason="driver 580.95.05", channel=CHANNEL, now=START)

    assert service.open_requests() == []


@pytest.mark.parametrize(("plan_start", "plan_end", "said"), [
    (START + 13 * HOUR, None,
     "start (2025-06-08 01:00:00+00:00) differs from the request's (2025-06-08 02:00:00+00:00)"),
    (START + 14 * HOUR, START + 17 * HOUR,
     "end (2025-06-08 05:00:00+00:00) differs from the request's (2025-06-08 04:00:00+00:00)"),
], ids=["start", "end"])
def test_a_plan_whose_window_differs_from_the_requests_is_a_programming_error_naming_both_times(
        service, plan_start, plan_end, said):  # noqa: F811
    plan = a_plan()
    windowed = dataclasses.replace(plan, summary=dataclasses.replace(
        plan.summary, window_start=plan_start, window_end=plan_end))

    with pytest.raises(ValueError) as wrong:
        submit(service, plan=windowed)  # the request's window: 2025-06-08 02:00 - 04:00 UTC

    assert str(wrong.value) == f"the plan's window {said}"
    assert service.open_requests() == []


# ------------------------------------------------------------------ expiry on touch


def test_a_pending_request_touched_after_its_deadline_expires_counted_by_the_pools_rule_as_it_is_now(db):
    view = submit(RequestService(db, CONFIG))  # serving-a: 2 approvals by 2025-06-08 12:00 UTC
    RequestService(db, CONFIG).approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    serving = CONFIG.pools["serving-a"].model_copy(update={"approvals": {"upgrade": 3}})
    stricter = RequestService(db, CONFIG.model_copy(update={"pools": {**CONFIG.pools, "serving-a": serving}}))
    late = START + 25 * HOUR

    with pytest.raises(RequestRefused, match=f"^{view.id} expired at 2025-06-08 12:00 UTC before"):
        stricter.approve(carol, view.id, plan_hash=view.plan_hash, now=late)

    row = last_audit(db, view.id)
    assert (row.actor, row.action, row.before, row.after, row.at) == (
        "gpuops", "request.expired", "pending", "expired", late)
    assert row.detail == {"expires_at": "2025-06-08T12:00:00.000000Z", "plan_hash": view.plan_hash,
                          "approvals_counted": 1, "approvals_required": 3}
    dedupe, payload = last_told(db)
    assert dedupe == f"{view.id}/expired"
    assert (payload["event"], payload["state"], payload["request_id"]) == ("request.expired", "expired", view.id)
    assert payload["text"] == f"{view.id} expired at 2025-06-08 12:00 UTC with 1 of 3 approvals."
    assert payload["people"] == ["U0ADA"]
    assert stricter.get(view.id).state == "expired"


# ------------------------------------------------------------------ a Slack delivery run again


def test_a_window_one_slack_delivery_extended_is_found_again_by_that_delivery_and_that_action_only(db, service):  # noqa: F811
    view = submit(service, kind="drain", pool="train-a")  # its window ends 2025-06-08 04:00 UTC
    plan = a_plan("drain", pool="train-a")
    first = RequestService(db, CONFIG, delivery="Ev0FIRST")
    first.extend_window(ada, view.id, plan, window_end=START + 18 * HOUR, now=START + HOUR)
    second = RequestService(db, CONFIG, delivery="Ev0SECOND")

    extended = second.extend_window(ada, view.id, plan, window_end=START + 20 * HOUR, now=START + 2 * HOUR)

    assert extended.window_end == START + 20 * HOUR
    assert first.window_end_before_this_delivery(view.id, "request.replanned") == WINDOW_END
    assert second.window_end_before_this_delivery(view.id, "request.replanned") == START + 18 * HOUR
    assert first.window_end_before_this_delivery(view.id, "request.extension_asked") is None
