"""Kinds of request and step as reference rows: the database refuses a kind nobody
registered, takes a new kind without rebuilding a table, and a database of the schema
before (CHECK lists) keeps its requests, runs and steps in flight when it is upgraded."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import approvals, requests, runs, steps
from storage.errors import ConstraintViolated
from storage.database import Database, open_database
from storage.migrations import MIGRATIONS
from workflows.kinds import KINDS, ChangeKind

AT = dt.datetime(2026, 12, 4, 9, 0, tzinfo=dt.timezone.utc)
LATER = AT + dt.timedelta(hours=1)
# A kind only this test knows: set a label on a node inside a window.
LABEL = ChangeKind(name="node-label", noun="a node label", title="Node label", step_kinds=("set-label",),
                   default_approvals={"serving": 1, "training": 0})


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "gpuops.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[Database]:
    kinds = KINDS.storage_kinds()
    with open_database(db_path, request_kinds=kinds.request_kinds, step_kinds=kinds.step_kinds) as database:
        yield database


def a_request(db: Database, *, kind: str = "upgrade", requester: str = "U0OTTO") -> requests.Request:
    return requests.create(db, kind=kind, pool="train-a", targets=["gpu-01"], window_start=None, window_end=None,
                           reason="x", requester=requester, requester_name="Otto", plan={"format": 1},
                           plan_hash="a" * 64, approvals_required=1, expires_at=LATER, at=AT)


def table_sql(db: Database, table: str) -> str:
    return db.execute("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?", [table]).fetchone()[0]


def test_the_database_itself_refuses_a_request_of_a_kind_nobody_registered(db):
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        a_request(db, kind="reboot")
    # Not even written past the repository.
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        db.execute("UPDATE requests SET kind = 'reboot' WHERE id = ?", [a_request(db).id])


def test_the_database_itself_refuses_a_step_of_a_kind_nobody_registered(db):
    run = runs.create(db, request_id=a_request(db).id, dry_run=False, at=AT)
    assert run is not None
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        steps.add(db, run_id=run.id, steps=[steps.NewStep(0, "gpu-01", 0, "reboot")])
    stored = steps.add(db, run_id=run.id, steps=[steps.NewStep(0, "gpu-01", 0, "cordon")])[0]
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        db.execute("UPDATE steps SET kind = 'reboot' WHERE id = ?", [stored.id])


def test_every_kind_in_the_registry_is_accepted_and_nothing_else_is_listed(db):
    assert {r["name"] for r in db.query("SELECT name FROM request_kinds")} == set(KINDS.names)
    listed = {r["name"] for r in db.query("SELECT name FROM step_kinds")}
    assert set(KINDS.step_kinds) <= listed
    for kind in KINDS.names:
        assert a_request(db, kind=kind).kind == kind


def test_a_new_kind_is_rows_written_when_the_database_opens_without_rebuilding_a_table(db_path, db):
    before = {table: table_sql(db, table) for table in ("requests", "steps")}
    with pytest.raises(ConstraintViolated):
        a_request(db, kind=LABEL.name)

    more = KINDS.with_kind(LABEL).storage_kinds()
    with open_database(db_path, request_kinds=more.request_kinds, step_kinds=more.step_kinds) as wider:
        request = a_request(wider, kind=LABEL.name)
        run = runs.create(wider, request_id=request.id, dry_run=False, at=AT)
        assert run is not None
        added = steps.add(wider, run_id=run.id, steps=[steps.NewStep(0, "gpu-01", 0, "set-label", {"k": "v"})])
        assert [(s.kind, s.detail) for s in added] == [("set-label", {"k": "v"})]
        assert {table: table_sql(wider, table) for table in ("requests", "steps")} == before
        assert wider.schema_version == MIGRATIONS[-1].version

    # Opening again without the kind keeps its rows: its stored requests stay readable.
    with open_database(db_path) as again:
        assert requests.get(again, id=request.id).kind == LABEL.name


def test_a_database_of_the_schema_before_keeps_its_requests_runs_and_steps_in_flight_and_they_go_on(db_path):
    with open_database(db_path, migrations=MIGRATIONS[:10]) as old:
        assert "CHECK (kind IN" in table_sql(old, "requests")
        moving = a_request(old, kind="migrate")
        approvals.record(old, request_id=moving.id, approver="U0BOB", decision="approve", plan_hash="a" * 64, at=AT)
        for state in ("approved", "scheduled", "running"):
            assert requests.transition(old, id=moving.id, expected=requests.get(old, id=moving.id).state,
                                       new=state, at=AT)
        run = runs.create(old, request_id=moving.id, dry_run=False, at=AT)
        assert run is not None and runs.transition(old, id=run.id, expected="pending", new="running", at=AT)
        in_flight = steps.add(old, run_id=run.id, steps=[
            steps.NewStep(0, "gpu-01", 0, "snapshot", {"labels": {"a": "b"}}),
            steps.NewStep(0, "gpu-01", 1, "cordon"),
            steps.NewStep(0, "gpu-01", 2, "host-driver-removed", {"by_hand": True}),
            steps.NewStep(0, "gpu-01", 3, "uncordon")])
        assert steps.transition(old, id=in_flight[0].id, expected="pending", new="done", at=AT)
        assert steps.transition(old, id=in_flight[1].id, expected="pending", new="done", at=AT)
        assert steps.transition(old, id=in_flight[2].id, expected="pending", new="running", at=AT)
        waiting = a_request(old, kind="drain")
        before_requests = [requests.get(old, id=r) for r in (moving.id, waiting.id)]
        before_run = runs.get(old, id=run.id)
        before_steps = steps.for_run(old, run_id=run.id)
        before_approvals = approvals.for_request(old, request_id=moving.id)

    kinds = KINDS.storage_kinds()
    with open_database(db_path, request_kinds=kinds.request_kinds, step_kinds=kinds.step_kinds) as db:
        assert db.schema_version == MIGRATIONS[-1].version
        assert "CHECK (kind IN" not in table_sql(db, "requests") + table_sql(db, "steps")
        assert [requests.get(db, id=r) for r in (moving.id, waiting.id)] == before_requests
        assert runs.get(db, id=run.id) == before_run
        assert steps.for_run(db, run_id=run.id) == before_steps
        assert approvals.for_request(db, request_id=moving.id) == before_approvals
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        # The run goes on where it was: the person's step ends, the next one starts.
        assert steps.transition(db, id=in_flight[2].id, expected="running", new="done", at=LATER)
        assert steps.transition(db, id=in_flight[3].id, expected="pending", new="running", at=LATER)
        assert runs.transition(db, id=run.id, expected="running", new="succeeded", at=LATER)
        assert requests.transition(db, id=moving.id, expected="running", new="done", at=LATER)
        # What pointed at requests still does: approvals' key and the two-person rule.
        with pytest.raises(ConstraintViolated, match="two-person rule"):
            approvals.record(db, request_id=waiting.id, approver="U0OTTO", decision="approve", plan_hash="a" * 64,
                             at=LATER)
        with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
            approvals.record(db, request_id="req-nope00", approver="U0BOB", decision="approve", plan_hash="a" * 64,
                             at=LATER)
        with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
            a_request(db, kind="reboot")
