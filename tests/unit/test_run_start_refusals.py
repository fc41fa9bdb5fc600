"""Why an approved request's run does not start (workflows.engine.runs `RunService.start`),
in the refusal's own words, with nothing written:

- a change freeze on the request's pool refuses the start naming the request, who froze
  the pool, until when (in the display zone) and why, and how to lift it; the request
  stays approved and can start once the freeze is lifted;
- with several clusters, a freeze holds only its own cluster's pool: a run of the
  same-named pool of another cluster starts;
- a request that needs approvals is refused by a run service that cannot read who holds
  the approver role now (fail closed), naming the request.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from storage import audit
from storage import freezes as stored_freezes
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.database import Database, open_database
from commands.catalog import dispatch
from workflows.engine import refusal_messages
from workflows.engine.runs import RunRefused, RunService
from workflows.fleet.summary import Fleet

from tests.unit.test_clusters import NOW, TWINS, Source, home_services

BERLIN = ZoneInfo("Europe/Berlin")
UNTIL = NOW + dt.timedelta(hours=3)


@pytest.fixture
def twins_db(make, tmp_path):
    """Two clusters that both call a pool `train`, and the database their services share;
    a drain of one node asked in each (the request ids, east then west)."""
    def fleet(prefix: str) -> Fleet:
        nodes = [make.node(f"gpu-{prefix}-{n:02d}", pool="train") for n in (1, 2)]
        return make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])

    db = open_database(tmp_path / "gpuops.db")
    services = home_services(TWINS, {"east": Source("east", fleet("e")), "west": Source("west", fleet("w"))}, db)
    ids = []
    for text, channel in (('/gpu drain gpu-e-01 "east disk"', "C0OPS"), ('/gpu drain gpu-w-01 "west disk"', "C0WEST")):
        asked = dispatch(text, actor=TWINS.actor("U0ALICE"), services=services, now=NOW, channel=channel)
        assert asked.ok
        ids.append(asked.title.split()[1])
    yield db, ids
    db.close()


def freeze(db: Database, *, cluster: str | None, reason: str = "incident 4711") -> None:
    stored_freezes.create(db, target="train", until=UNTIL, reason=reason, let_running_finish=False,
                          set_by="U0ERIN", set_by_name="erin", at=NOW, cluster=cluster)


def refused(service: RunService, request_id: str) -> str:
    with pytest.raises(RunRefused) as refusal:
        service.start(request_id, dry_run=False, now=NOW)
    return str(refusal.value)


def test_a_frozen_pool_refuses_the_start_saying_who_froze_it_until_when_and_why_and_writes_nothing(twins_db):
    db, (east, _west) = twins_db
    freeze(db, cluster="east")
    service = RunService(db, zone=BERLIN)

    said = refused(service, east)

    assert said == ("The run of " + east + " does not start: pool train is frozen by erin until "
                    "2026-12-02 14:00 CET (incident 4711). The request stays approved; it can start when the "
                    "freeze ends or is lifted (`/gpu unfreeze train`).")
    request = stored_requests.get(db, id=east)  # type: ignore[arg-type]
    assert request is not None and request.state == "approved"
    assert stored_runs.for_request(db, request_id=request.id) == []
    assert [e.action for e in audit.for_request(db, request.id)] == ["request.created", "request.approved"]


def test_a_freeze_of_one_clusters_pool_holds_that_cluster_only(twins_db):
    db, (east, west) = twins_db
    freeze(db, cluster="west", reason="")
    service = RunService(db)

    said = refused(service, west)
    started = service.start(east, dry_run=False, now=NOW)

    assert said.startswith(f"The run of {west} does not start: pool train is frozen by erin until 2026-12-02 13:00 UTC.")
    assert started.request_id == east and started.state == "pending"
    assert [r.request_id for r in stored_runs.for_request(db, request_id=west)] == []  # type: ignore[arg-type]


def test_a_run_service_that_cannot_read_who_approves_now_refuses_a_request_that_needs_approvals(twins_db):
    db, (east, _west) = twins_db
    with db.transaction():
        db.execute("UPDATE requests SET approvals_required = 1 WHERE id = ?", (east,))

    said = refused(RunService(db), east)

    assert said == refusal_messages.cannot_check_approvals(east) == (
        f"{east} needs approvals, and this run service cannot read who holds the approver role now: not started")
    assert stored_runs.for_request(db, request_id=east) == []  # type: ignore[arg-type]
