"""What the window rule (workflows.engine.window_start) reports at a tick, word for word:
the run it started, why a missed mark or a start was refused when the request changed
after the scheduler read it, a window whose end passed, a request approved exactly at its
window's start, and which change freezes hold it (its own cluster's, not another's; one
that lets running runs finish still holds a run that has not started).

The requests, the database and the clock are test_window_start's."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from freezegun import freeze_time

from commands.services import Services
from tests.unit import test_window_start
from tests.unit.test_window_start import ALICE, CONFIG, END, ERIN, MINUTE, NOW, START, UTC, approved, tick
from workflows.engine.refusal_messages import request_not_runnable
from workflows.engine.runs import RunService
from workflows.engine.window_start import START_GRACE, WindowStart, start_at_window, window_missed
from workflows.pools.freezes import FreezeService
from workflows.requests.messages import changed_meanwhile
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

services = test_window_start.services  # its fixture: one cluster's services on a fresh database
SECOND = dt.timedelta(seconds=1)
# The same pools, as the configuration of a cluster named west (`cluster.name`).
WEST = CONFIG.model_copy(update={"cluster": CONFIG.cluster.model_copy(update={"name": "west"})})


def tick_on(services: Services, view: RequestView):
    """A tick on `view` as the scheduler read it, however the request changed since."""
    db = services.database
    requests = RequestService(db, CONFIG)  # type: ignore[arg-type]
    return start_at_window(db, view, requests=requests, runs=RunService(db, requests=requests),  # type: ignore[arg-type]
                           now=dt.datetime.now(UTC))


def missed_told(services: Services) -> int:
    return len(services.database.query(  # type: ignore[union-attr]
        "SELECT payload FROM outbox WHERE payload LIKE '%request.missed%'"))


@pytest.fixture
def west(make, tmp_path: Path):
    """Services of cluster west, on a database another cluster's gpuops shares."""
    yield from test_window_start.services_on(make, tmp_path, WEST)


def test_the_started_outcome_carries_the_run_that_was_queued(services):
    with freeze_time(START):
        request = approved(services)
        started = tick(services, request.id)

    runs = services.runs.for_request(request.id)
    assert started.outcome == "started"
    assert started.run is not None
    assert (started.run.id, started.run.request_id, started.run.state) == (runs[0].id, request.id, "pending")
    assert started.refusal is None


def test_a_request_approved_inside_its_window_is_missed_once_the_window_ends_not_started_late(services):
    with freeze_time(START + 15 * MINUTE) as frozen:
        request = approved(services)
        frozen.move_to(END)  # no leader from its approval to its window's end
        at_end = tick(services, request.id)

    assert (at_end.outcome, at_end.changed) == ("missed", True)
    assert services.runs.for_request(request.id) == []
    assert services.requests.get(request.id).state == "missed"
    assert missed_told(services) == 1


@pytest.mark.parametrize(("approved_at", "missed"), [
    (START, True),            # approved as the window began: the grace counts from its start
    (START + SECOND, False),  # approved inside the window: may start then
])
def test_the_grace_counts_from_the_window_start_for_a_request_approved_exactly_then(approved_at, missed):
    assert window_missed(start=START, end=END, approved_at=approved_at,
                         now=START + START_GRACE + SECOND) is missed


def test_a_request_approved_exactly_as_its_window_begins_is_missed_a_second_after_the_grace(services):
    with freeze_time(START) as frozen:
        request = approved(services)
        assert services.requests.get(request.id).updated_at == START
        frozen.move_to(START + START_GRACE + SECOND)
        late = tick(services, request.id)

    assert late.outcome == "missed"
    assert services.runs.for_request(request.id) == []


def test_a_request_cancelled_after_the_scheduler_read_it_is_not_marked_missed_and_says_it_changed(services):
    with freeze_time(NOW) as frozen:
        request = approved(services)
        frozen.move_to(START + START_GRACE + MINUTE)
        read = services.requests.get(request.id)
        services.requests.cancel(ALICE, request.id, now=dt.datetime.now(UTC))
        refused = tick_on(services, read)

    assert (refused.outcome, refused.changed) == ("not marked missed", False)
    assert refused.refusal == changed_meanwhile(request.id)
    assert services.requests.get(request.id).state == "cancelled"
    assert missed_told(services) == 0


def test_a_request_cancelled_after_the_scheduler_read_it_is_not_started_and_says_it_is_cancelled(services):
    with freeze_time(NOW) as frozen:
        request = approved(services)
        frozen.move_to(START)
        read = services.requests.get(request.id)
        services.requests.cancel(ALICE, request.id, now=dt.datetime.now(UTC))
        refused = tick_on(services, read)

    assert (refused.outcome, refused.changed, refused.run) == ("not started", False, None)
    assert refused.refusal == request_not_runnable(request.id, "cancelled")
    assert services.runs.for_request(request.id) == []


def ticked_at_start_under(services: Services, freezer: FreezeService, *, let_running_finish: bool
                          ) -> tuple[RequestView, WindowStart]:
    """A request approved before its window, `freezer`'s freeze of serve-b set, then the
    scheduler's tick as the window begins."""
    with freeze_time(NOW) as frozen:
        request = approved(services)
        freezer.set(ERIN, target="serve-b", until=START + 3 * MINUTE, reason="launch",
                    let_running_finish=let_running_finish, now=NOW)
        frozen.move_to(START)
        return request, tick(services, request.id)


def test_a_freeze_that_lets_running_runs_finish_still_holds_a_run_that_has_not_started(services):
    request, held = ticked_at_start_under(services, services.freezes, let_running_finish=True)

    assert (held.outcome, held.changed) == ("frozen", False)
    assert services.runs.for_request(request.id) == []


def test_a_freeze_of_the_requests_own_cluster_holds_it(west):
    request, held = ticked_at_start_under(west, west.freezes, let_running_finish=False)

    assert request.cluster == "west"
    assert (held.outcome, held.refusal) == ("frozen", None)
    assert west.runs.for_request(request.id) == []


def test_a_freeze_of_a_same_named_pool_in_another_cluster_does_not_hold_it(west):
    east = FreezeService(west.database, pools={"serve-b"}, cluster="east")
    request, started = ticked_at_start_under(west, east, let_running_finish=False)

    assert started.outcome == "started"
    assert [r.state for r in west.runs.for_request(request.id)] == ["pending"]
