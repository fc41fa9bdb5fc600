"""`gpuops database copy SQLITE_PATH TARGET`: a team's data moved whole into an empty
database, ids, audit chain and head kept, or not at all.

The target is a fixture parameter: a SQLite file here; a PostgreSQL database is one more
parameter (`empty_target` yields a location and a way to read every table back)."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from storage import approvals, audit, freezes, handovers, idempotency, kv, outbox, requests, runs, steps
from storage.copying import REFERENCE_TABLES, tables_in_order
from storage.database import Database, open_database
from storage.ids import RequestId
from storage.locations import DatabaseLocation, database_location
from storage.migrations import latest_version

NOW = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


@dataclass
class Target:
    location: DatabaseLocation
    # Every table's rows, in key order ({} while the database does not exist).
    dump: Callable[[], dict[str, list[dict[str, Any]]]]
    exists: Callable[[], bool]


def dump_of(db: Database) -> dict[str, list[dict[str, Any]]]:
    return {table: db.query(f'SELECT * FROM "{table}" ORDER BY 1') for table in tables_in_order(db)}


@pytest.fixture(params=["sqlite"])
def empty_target(request, tmp_path: Path) -> Iterator[Target]:
    """An empty database to copy into (for PostgreSQL: a fresh database on the test server)."""
    path = tmp_path / "copy" / "gpuops.db"

    def dump() -> dict[str, list[dict[str, Any]]]:
        if not path.exists():
            return {}
        with open_database(path) as db:
            return dump_of(db)

    yield Target(location=database_location(str(path)), dump=dump, exists=path.exists)


def fill(db: Database) -> dict[str, str]:
    """A team's history: requests decided, a run with steps, freezes (one replaced by a
    later one), a handover acknowledged, messages queued and sent, keys remembered, each
    change audited as the services audit it."""
    def audited(action: str, target: str, **ids: Any) -> None:
        audit.append(db, actor=ids.pop("actor", "U0REQ"), k8s_identity=None, action=action, target=target, at=NOW,
                     **ids)

    made = []
    for n in (1, 2, 3):
        request = requests.create(
            db, id=RequestId(f"req-00000{n}"), kind="upgrade", pool="serving-a", targets=["gpu-01", "gpu-02"],
            window_start=NOW + 14 * HOUR, window_end=NOW + 16 * HOUR, reason=f"driver bump {n}",
            requester="U0REQ", requester_name="Ada", plan={"waves": [["gpu-01"], ["gpu-02"]], "to": "580.95.05"},
            plan_hash=f"plan-{n}", approvals_required=1, expires_at=NOW + 12 * HOUR, at=NOW)
        audited("request.created", request.id, request_id=request.id)
        approvals.record(db, request_id=request.id, approver="U0APP", decision="approve", plan_hash=f"plan-{n}",
                         at=NOW)
        audited("request.approve", request.id, request_id=request.id, actor="U0APP")
        made.append(request)
    run = runs.create(db, request_id=made[0].id, dry_run=False, at=NOW)
    assert run is not None
    audited("run.started", run.id, request_id=made[0].id, run_id=run.id)
    steps.add(db, run_id=run.id, steps=[steps.NewStep(wave=0, node="gpu-01", seq=0, kind="cordon"),
                                        steps.NewStep(wave=1, node="gpu-02", seq=0, kind="cordon")])
    first, _ = freezes.create(db, target="serving-a", until=NOW + 3 * HOUR, reason="incident", let_running_finish=True,
                              set_by="U0OPS", set_by_name="Grace", at=NOW)
    audited("freeze.set", "serving-a")
    second, replaced = freezes.create(db, target="serving-a", until=NOW + 6 * HOUR, reason="longer",
                                      let_running_finish=False, set_by="U0OPS", set_by_name="Grace", at=NOW + HOUR)
    assert replaced is not None and replaced.id == first.id  # the older row names the newer one
    audited("freeze.set", "serving-a")
    handover = handovers.create(db, rotation="gpu-oncall", shift_start=NOW, channel="C0OPS", content={"items": []})
    assert handover is not None
    handovers.record_ack(db, handover_id=handover.id, user="U0OPS", at=NOW, counted=True)
    audited("handover.ack", str(handover.id))
    sent = outbox.enqueue(db, channel="C0OPS", kind="post", payload={"text": "approved"}, at=NOW)
    assert sent is not None
    outbox.mark_sent(db, id=sent.id, message_ts="1.000", at=NOW)
    outbox.enqueue(db, channel="C0OPS", kind="post", payload={"text": "started"}, at=NOW, dedupe_key="run-start")
    idempotency.remember(db, key="Ev01", scope="slack-event", at=NOW)
    kv.put(db, key="engine.note", value="held by gpuops-0")
    head = audit.head_of(db)
    return {"head": head.text}


def cli(words: list[str], target: Target, monkeypatch: pytest.MonkeyPatch) -> int:
    """`gpuops WORDS... TARGET` for a database command: the target on the command line, or,
    as a URL with its password must be, in GPUOPS_DATABASE_URL."""
    if target.location.has_password:
        monkeypatch.setenv("GPUOPS_DATABASE_URL", str(target.location.target))
        return main(words)
    if words[0] == "audit":
        return main([*words, "--database", str(target.location.target)])
    return main([*words, str(target.location.target)])


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "team" / "gpuops.db"
    with open_database(path) as db:
        head = fill(db)["head"]
    return path, head


def test_a_copy_holds_every_row_with_its_id_and_verifies_with_the_sources_head(
        source, empty_target, capsys, monkeypatch):
    path, head = source

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 0

    out = capsys.readouterr().out
    assert f"head {head}, the source's" in out
    assert "requests: 3 rows" in out and "freezes: 2 rows" in out
    with open_database(path) as db:
        expected = dump_of(db)
    copied = empty_target.dump()
    for table in expected:
        if table not in ("schema_migrations",):  # each database's own migration times
            assert copied[table] == expected[table], table
    assert [f["replaced_by"] for f in copied["freezes"]] == [2, None]
    assert cli(["audit", "verify", "--expected", head], empty_target, monkeypatch) == 0
    assert f"head {head}" in capsys.readouterr().out


def test_a_target_that_already_holds_data_is_refused_by_table_and_left_unchanged(
        source, empty_target, capsys, monkeypatch):
    path, _ = source
    with open_database(empty_target.location.target) as db:
        idempotency.remember(db, key="Ev99", scope="slack-event", at=NOW)
    before = empty_target.dump()

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 1

    err = capsys.readouterr().err
    assert "already holds data (table idempotency has rows)" in err
    assert empty_target.dump() == before


def test_reference_rows_alone_do_not_count_as_data(source, empty_target, monkeypatch):
    path, _ = source
    with open_database(empty_target.location.target, request_kinds=["drain"], step_kinds=["cordon"]):
        pass
    assert all(empty_target.dump()[table] for table in REFERENCE_TABLES)

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 0


def test_a_source_written_by_a_newer_gpuops_is_refused_and_nothing_is_copied(source, empty_target, capsys, monkeypatch):
    path, _ = source
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(f"PRAGMA user_version = {latest_version() + 1}")
    raw.close()

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 2

    assert f"this gpuops knows up to {latest_version()}" in capsys.readouterr().err
    assert not any(rows for table, rows in empty_target.dump().items() if table not in REFERENCE_TABLES)


def test_a_copy_whose_audit_chain_would_not_verify_writes_nothing(source, empty_target, capsys, monkeypatch):
    path, _ = source
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TRIGGER audit_no_update")
    raw.execute("UPDATE audit SET target = 'elsewhere' WHERE seq = 2")  # a row rewritten behind gpuops's back
    raw.close()

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 1

    assert "the copy's audit chain does not verify" in capsys.readouterr().err
    assert not any(rows for table, rows in empty_target.dump().items() if table not in REFERENCE_TABLES)


def test_a_row_the_target_refuses_names_its_table_and_nothing_is_written(source, empty_target, capsys, monkeypatch):
    path, _ = source
    raw = sqlite3.connect(path, isolation_level=None)  # foreign keys off, as any SQLite connection starts
    raw.execute("INSERT INTO approvals (request_id, approver, decision, plan_hash, created_at)"
                " VALUES ('req-gone', 'U0APP', 'approve', 'plan-x', '2026-03-02T09:00:00.000000Z')")
    raw.close()

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 1

    err = capsys.readouterr().err
    assert "the target refused a row of table approvals (" in err and "nothing was written" in err
    assert not any(rows for table, rows in empty_target.dump().items() if table not in REFERENCE_TABLES)


def test_a_missing_source_is_refused_and_not_created(tmp_path, empty_target, capsys, monkeypatch):
    missing = tmp_path / "nowhere" / "gpuops.db"

    assert cli(["database", "copy", str(missing)], empty_target, monkeypatch) == 1

    assert f"there is no gpuops database at {missing}" in capsys.readouterr().err
    assert not missing.exists() and not missing.parent.exists()


def test_a_target_url_with_its_password_on_the_command_line_is_refused_without_showing_it(source, capsys):
    path, _ = source

    assert main(["database", "copy", str(path), "postgresql://gpuops:hunter2@db.example:5432/gpuops"]) == 2

    err = capsys.readouterr().err
    assert "postgresql://gpuops:***@db.example:5432/gpuops carries its password" in err
    assert "GPUOPS_DATABASE_URL" in err and "hunter2" not in err


def test_the_source_must_be_a_sqlite_file(capsys):
    assert main(["database", "copy", "postgresql://db.example/gpuops", "/tmp/x.db"]) == 2
    assert "the source is a gpuops SQLite file's path" in capsys.readouterr().err


def test_a_row_naming_a_later_row_of_its_own_table_copies_when_the_rows_go_in_separate_statements(
        source, empty_target, monkeypatch):
    # A large table goes in several INSERTs; an older freeze names the newer one that
    # replaced it, which one statement per row puts in after it.
    monkeypatch.setattr("storage.copying._PARAMETERS_PER_INSERT", 1)
    path, _ = source

    assert cli(["database", "copy", str(path)], empty_target, monkeypatch) == 0

    assert [f["replaced_by"] for f in empty_target.dump()["freezes"]] == [2, None]
