"""The storage layer: opening and migrating the database, transactions, and the
repositories for requests, approvals, runs, steps, idempotency keys, handovers and kv.

The audit chain and the outbox have their own files (test_storage_audit.py,
test_storage_outbox.py). Every test uses a real SQLite file under tmp_path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import os
import sqlite3
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest
import sqlite_utils
from freezegun import freeze_time

from storage import approvals, audit, handovers, idempotency, kv, outbox, requests, runs, sqlite_backend, steps
from storage.database import Database, PerThreadDatabase, default_database_path, open_database
from storage.errors import ConstraintViolated, DatabaseUnavailable, MigrationFailed, MigrationsOutOfOrder, NotAGpuopsDatabase, SchemaTooNew
from storage.ids import RequestId, RunId
from storage.migrations import MIGRATIONS, Migration, latest_version
from testenv.install import wait_until
from workflows.kinds import KINDS

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


def new_request(
    db: Database,
    *,
    id: str | None = None,
    plan_hash: str = "plan-1",
    at: dt.datetime = NOW,
    expires_at: dt.datetime | None = None,
    pool: str = "serving-a",
) -> requests.Request:
    return requests.create(
        db,
        id=RequestId(id) if id else None,
        kind="upgrade",
        pool=pool,
        targets=["gpu-h100-01", "gpu-h100-02"],
        window_start=NOW + 14 * HOUR,
        window_end=NOW + 16 * HOUR,
        reason="driver 580.95.05 fixes Xid 79",
        requester="U0REQ",
        requester_name="Ada",
        plan={"waves": [["gpu-h100-01"], ["gpu-h100-02"]], "to": "580.95.05"},
        plan_hash=plan_hash,
        approvals_required=2,
        expires_at=expires_at or at + 12 * HOUR,
        at=at,
    )


def race(workers: int, db_path: Path, action: Callable[[Database], object]) -> list[object]:
    """Run `action` in `workers` threads at once, each with its own connection."""
    barrier = threading.Barrier(workers)
    results: list[object] = [None] * workers
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            with open_database(db_path) as own:
                barrier.wait()
                results[index] = action(own)
        except BaseException as err:  # surfaced in the main thread below
            errors.append(err)
            barrier.abort()  # the others stop waiting for a thread that will never come

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return results


def table_names(path: Path) -> set[str]:
    with sqlite_utils.Database(path) as raw:
        return set(raw.table_names())


# ------------------------------------------------------------------ opening and migrating


def test_opening_a_new_path_creates_private_folders_a_private_file_and_the_whole_schema(tmp_path):
    path = tmp_path / "a" / "b" / "gpuops.db"

    with open_database(path) as db:
        assert db.schema_version == latest_version() == MIGRATIONS[-1].version

    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert {
        "requests",
        "approvals",
        "runs",
        "steps",
        "audit",
        "outbox",
        "idempotency",
        "handovers",
        "handover_acks",
        "kv",
        "schema_migrations",
    } <= table_names(path)


def test_reopening_a_migrated_database_applies_nothing_and_keeps_its_data(db_path):
    with freeze_time("2025-06-07T12:00:00Z"):
        with open_database(db_path) as db:
            kv.put(db, key="engine.holder", value="gpuops-0")

    with freeze_time("2025-06-08T09:30:00Z"):
        with open_database(db_path) as db:
            assert kv.get(db, key="engine.holder") == "gpuops-0"
            history = db.query("SELECT version, applied_at FROM schema_migrations")

    assert history == [{"version": m.version, "applied_at": "2025-06-07T12:00:00.000000Z"} for m in MIGRATIONS]


def test_the_connection_uses_wal_foreign_keys_full_sync_and_a_busy_timeout(db):
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("foreign_keys") == 1
    assert db.pragma("synchronous") == 2  # FULL
    assert db.pragma("busy_timeout") == 5000


def test_a_database_from_a_newer_gpuops_is_refused_and_left_byte_for_byte_unchanged(db_path):
    with open_database(db_path) as db:
        new_request(db, id="req-000001")
    raw = sqlite3.connect(db_path, isolation_level=None)
    newer = latest_version() + 1
    raw.execute(f"PRAGMA user_version = {newer}")
    raw.close()
    before = db_path.read_bytes()

    with pytest.raises(SchemaTooNew) as refused:
        open_database(db_path)

    assert str(refused.value) == (
        f"database {db_path} has schema version {newer}, this gpuops knows up to {latest_version()}; "
        "upgrade gpuops or point it at another database"
    )
    assert db_path.read_bytes() == before
    wal = db_path.with_name(db_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_another_programs_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    raw.close()
    before = path.read_bytes()

    with pytest.raises(NotAGpuopsDatabase, match="not a gpuops database"):
        open_database(path)

    assert path.read_bytes() == before


def test_a_file_that_is_not_sqlite_at_all_is_refused(tmp_path):
    path = tmp_path / "gpuops.db"
    path.write_text("hello, I am a text file and definitely not a database\n" * 20)

    with pytest.raises(NotAGpuopsDatabase):
        open_database(path)


def failing_function(db: sqlite_utils.Database) -> None:
    db.execute("CREATE TABLE half_done (x INTEGER)")
    db.execute("INSERT INTO kv (key, value) VALUES ('written-by', 'v2')")
    raise RuntimeError("disk said no")


@pytest.mark.parametrize(
    "second",
    [
        Migration(2, "a function that raises halfway", failing_function),
        Migration(
            2,
            "SQL whose third statement fails",
            "CREATE TABLE half_done (x INTEGER);"
            "INSERT INTO kv (key, value) VALUES ('written-by', 'v2');"
            "INSERT INTO no_such_table VALUES (1);",
        ),
    ],
    ids=["function", "sql"],
)
def test_a_failing_migration_rolls_back_entirely_and_keeps_the_previous_version(db_path, second):
    with pytest.raises(MigrationFailed, match="rolled back") as failed:
        open_database(db_path, migrations=(MIGRATIONS[0], second))

    assert failed.value.version == 2
    with open_database(db_path, migrations=MIGRATIONS[:1]) as db:  # still usable by a gpuops that knows version 1
        assert db.schema_version == 1
        assert db.query("SELECT version FROM schema_migrations") == [{"version": 1}]
        assert kv.get(db, key="written-by") is None
    assert "half_done" not in table_names(db_path)


def test_a_migration_that_succeeds_later_moves_the_version_on(db_path):
    open_database(db_path).close()
    next_version = latest_version() + 1
    add_column = Migration(
        next_version, "runs remember who started them", "ALTER TABLE runs ADD COLUMN started_by TEXT;"
    )

    with open_database(db_path, migrations=(*MIGRATIONS, add_column)) as db:
        assert db.schema_version == next_version
        assert [r["version"] for r in db.query("SELECT version FROM schema_migrations")] == list(
            range(1, next_version + 1))


def test_migrations_must_be_numbered_one_two_three_without_gaps(db_path):
    skipping = (MIGRATIONS[0], Migration(3, "skips two", "SELECT 1;"))

    with pytest.raises(MigrationsOutOfOrder, match=r"\[1, 3\]"):
        open_database(db_path, migrations=skipping)


def test_threads_opening_a_new_database_at_once_apply_each_migration_exactly_once(db_path):
    race(6, db_path, lambda db: db.schema_version)

    with open_database(db_path) as db:
        assert db.query("SELECT version FROM schema_migrations") == [{"version": m.version} for m in MIGRATIONS]


def _blocked_on_flock(lock_file: Path) -> bool:
    """Whether some open file description waits for a flock on `lock_file` (/proc/locks
    lists waiters with "->")."""
    inode = lock_file.stat().st_ino
    return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[-3].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines())


def test_an_opener_waits_while_another_is_still_making_the_database_and_then_opens_it_whole(db_path):
    # Two openers of a new file at once used to interleave: one's switch to WAL said
    # "database is locked", or its probe refused the other's half-made file.
    lock_file = db_path.with_name(db_path.name + ".open-lock")
    db_path.parent.mkdir(mode=0o700)
    opened: list[object] = []
    holder = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)  # another opener, mid-way
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = threading.Thread(target=lambda: opened.append(open_database(db_path).close()))
    try:
        waiter.start()
        wait_until(lambda: _blocked_on_flock(lock_file), timeout=10, what="the second opener to wait")
        assert not db_path.exists()  # it touched nothing while the other was opening
    finally:
        os.close(holder)
    waiter.join(timeout=10)
    assert opened == [None]
    with open_database(db_path) as db:
        assert db.schema_version == latest_version()
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600


def test_opening_a_new_database_from_many_threads_at_once_never_fails(tmp_path):
    for round_ in range(30):
        path = tmp_path / f"round-{round_}" / "gpuops.db"
        versions = race(6, path, lambda db: db.schema_version)
        assert versions == [latest_version()] * 6


def test_the_default_path_is_under_the_checkout_for_the_demo_and_var_lib_in_a_container():
    assert default_database_path(in_container=False) == Path("./.gpuops/gpuops.db")
    assert default_database_path(in_container=True) == Path("/var/lib/gpuops/gpuops.db")


# ------------------------------------------------------------------ transactions and threads


def test_a_transition_its_audit_row_and_its_outbox_message_commit_together_or_not_at_all(db):
    request = new_request(db)
    created = audit.append(db, actor="U0APP", k8s_identity=None, action="request.created", target=request.id,
                           request_id=request.id, at=NOW)  # as the request service writes it

    with pytest.raises(RuntimeError):
        with db.transaction():
            assert requests.transition(
                db, id=request.id, expected="pending", new="approved", at=NOW
            )
            audit.append(
                db,
                actor="U0APP",
                k8s_identity=None,
                action="request.approve",
                target=request.id,
                request_id=request.id,
                at=NOW,
            )
            outbox.enqueue(db, channel="C0OPS", kind="post", payload={"text": "approved"}, at=NOW)
            raise RuntimeError("the process died before commit")

    assert requests.get(db, id=request.id).state == "pending"
    assert audit.recent(db, 10) == [created]
    assert outbox.claim_pending(db, limit=10, now=NOW) == []
    assert audit.verify(db).ok


def test_a_failing_inner_block_undoes_only_its_own_writes(db):
    with db.transaction():
        kv.put(db, key="outer", value="kept")
        with pytest.raises(ValueError):
            with db.transaction():
                kv.put(db, key="inner", value="undone")
                raise ValueError("inner step failed")

    assert kv.get(db, key="outer") == "kept"
    assert kv.get(db, key="inner") is None


def test_a_database_handle_cannot_be_used_from_another_thread(db):
    caught: list[BaseException] = []

    def use() -> None:
        try:
            kv.get(db, key="x")
        except BaseException as err:
            caught.append(err)

    t = threading.Thread(target=use)
    t.start()
    t.join()

    assert len(caught) == 1 and isinstance(caught[0], sqlite3.ProgrammingError)


def test_a_per_thread_database_gives_each_thread_its_own_connection(db_path):
    shared = PerThreadDatabase(db_path)
    mine = shared.get()
    seen: list[Database] = []

    def work() -> None:
        theirs = shared.get()
        assert shared.get() is theirs
        kv.put(theirs, key="from-worker", value="hello")
        seen.append(theirs)
        shared.close()

    t = threading.Thread(target=work)
    t.start()
    t.join()

    assert seen and seen[0] is not mine
    assert kv.get(mine, key="from-worker") == "hello"
    shared.close()


def gone(path: Path) -> None:
    """The database file and its -wal and -shm, gone from under the bot (a volume unmounted)."""
    for leftover in path.parent.glob(path.name + "*"):
        leftover.unlink()


def assert_another_thread_finds_it_gone(shared: PerThreadDatabase, path: Path) -> None:
    """A worker thread opening its connection is told the file is gone, and makes none."""
    caught: list[BaseException] = []

    def work() -> None:
        try:
            shared.get()
        except BaseException as err:  # noqa: BLE001 - what the thread met is the test's answer
            caught.append(err)

    t = threading.Thread(target=work)
    t.start()
    t.join()

    assert len(caught) == 1 and isinstance(caught[0], DatabaseUnavailable), caught
    assert f"the database file {path} is gone" in str(caught[0])
    assert not path.exists()
    shared.close()


def test_a_database_file_that_disappears_is_not_created_again_empty_by_the_next_thread(tmp_path):
    """Its volume unmounted or the file deleted under a running bot: a worker thread opening
    its connection must not start a fresh, empty database beside the runs it forgot."""
    path = tmp_path / "gpuops.db"
    shared = PerThreadDatabase(path)
    kv.put(shared.get(), key="runs", value="three in flight")
    gone(path)
    assert_another_thread_finds_it_gone(shared, path)


def test_a_database_file_that_goes_between_the_check_and_the_open_is_not_created_again_either(tmp_path, monkeypatch):
    """The next thread's check finds the file, and it goes (its volume unmounted) just
    before that thread's connection opens: the open refuses to make it anew, as the check
    would have."""
    path = tmp_path / "gpuops.db"
    shared = PerThreadDatabase(path)
    kv.put(shared.get(), key="runs", value="three in flight")
    probe = sqlite_backend._probe_read_only

    def then_it_goes(found: Path, **kwargs):
        probe(found, **kwargs)
        gone(path)

    monkeypatch.setattr(sqlite_backend, "_probe_read_only", then_it_goes)
    assert_another_thread_finds_it_gone(shared, path)


def test_an_open_told_not_to_create_refuses_a_missing_file_and_makes_none(tmp_path):
    path = tmp_path / "gpuops.db"
    with pytest.raises(DatabaseUnavailable, match="is not created again empty"):
        open_database(path, create=False)
    assert not path.exists()
    open_database(path).close()  # the first open of a new installation makes it
    open_database(path, create=False).close()


def test_naive_datetimes_are_refused_because_their_zone_would_be_a_guess(db):
    with pytest.raises(ValueError, match="naive datetime"):
        new_request(db, at=dt.datetime(2025, 6, 7, 12, 0))


def test_times_in_other_zones_are_stored_and_returned_in_utc(db):
    cest = dt.timezone(dt.timedelta(hours=2))

    request = new_request(db, at=dt.datetime(2025, 6, 7, 14, 0, tzinfo=cest))

    stored = requests.get(db, id=request.id)
    assert stored.created_at == NOW and stored.created_at.tzinfo == dt.timezone.utc
    assert db.query("SELECT created_at FROM requests") == [
        {"created_at": "2025-06-07T12:00:00.000000Z"}
    ]


@pytest.mark.parametrize("text", ["2025-06-07T12:00:00Z", "2025-06-07 12:00:00.000000Z",
                                  "2025-13-07T12:00:00.000000Z", "2025-06-07T12:00:00.000000+00:00", ""])
def test_a_stored_time_reads_back_exactly_and_any_other_text_is_refused(text):
    from storage import codec

    at = dt.datetime(2025, 6, 7, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    assert codec.time_from_text(codec.time_to_text(at)) == at
    with pytest.raises(ValueError):
        codec.time_from_text(text)


# ------------------------------------------------------------------ requests and approvals


def test_a_new_request_is_pending_and_reads_back_as_the_same_frozen_value(db):
    created = new_request(db)

    assert created.id.startswith("req-") and len(created.id) == len("req-7f3a2c")
    assert created.state == "pending"
    assert requests.get(db, id=created.id) == created
    with pytest.raises(dataclasses.FrozenInstanceError):
        created.state = "approved"


def test_an_unknown_request_reads_as_none(db):
    assert requests.get(db, id=RequestId("req-ffffff")) is None


def test_a_transition_happens_only_from_an_expected_state(db):
    request = new_request(db)

    assert not requests.transition(db, id=request.id, expected="approved", new="scheduled", at=NOW)
    assert requests.transition(
        db, id=request.id, expected=("pending", "approved"), new="cancelled", at=NOW + HOUR
    )
    stored = requests.get(db, id=request.id)
    assert stored.state == "cancelled" and stored.finished
    assert stored.updated_at == NOW + HOUR


def test_two_threads_racing_to_move_the_same_request_exactly_one_wins(db, db_path):
    for round_ in range(20):
        request_id = new_request(db, id=f"req-race{round_:02d}").id

        outcomes = race(
            2,
            db_path,
            lambda own: requests.transition(
                own, id=request_id, expected="pending", new="approved", at=NOW
            ),
        )

        assert sorted(outcomes) == [False, True]


def test_approving_and_denying_at_once_leaves_the_request_in_exactly_one_of_them(db, db_path):
    request = new_request(db)
    turn = iter(["approved", "denied", "approved", "denied"])
    lock = threading.Lock()

    def decide(own: Database) -> tuple[str, bool]:
        with lock:
            new = next(turn)
        return new, requests.transition(own, id=request.id, expected="pending", new=new, at=NOW)

    outcomes = race(4, db_path, decide)

    winners = [new for new, won in outcomes if won]
    assert len(winners) == 1
    assert requests.get(db, id=request.id).state == winners[0]


def test_a_second_click_by_the_same_approver_on_the_same_plan_is_recorded_once(db):
    request = new_request(db)

    first = approvals.record(
        db, request_id=request.id, approver="U0APP", decision="approve", plan_hash="plan-1", at=NOW
    )
    again = approvals.record(
        db,
        request_id=request.id,
        approver="U0APP",
        decision="approve",
        plan_hash="plan-1",
        at=NOW + HOUR,
    )

    assert first is not None and first.approver == "U0APP" and first.created_at == NOW
    assert again is None
    assert approvals.for_request(db, request_id=request.id) == [first]


def test_concurrent_clicks_by_one_approver_store_one_decision(db, db_path):
    request = new_request(db)

    outcomes = race(
        5,
        db_path,
        lambda own: approvals.record(
            own,
            request_id=request.id,
            approver="U0APP",
            decision="approve",
            plan_hash="plan-1",
            at=NOW,
        ),
    )

    assert sum(o is not None for o in outcomes) == 1
    assert len(approvals.for_request(db, request_id=request.id)) == 1


def test_a_replanned_request_needs_decisions_on_the_new_plan_hash(db):
    request = new_request(db, plan_hash="plan-1")
    approvals.record(
        db, request_id=request.id, approver="U0APP", decision="approve", plan_hash="plan-1", at=NOW
    )

    assert not requests.replace_plan(
        db,
        id=request.id,
        expected_plan_hash="plan-0",
        plan={"waves": []},
        plan_hash="plan-2",
        at=NOW,
    )
    assert requests.replace_plan(
        db,
        id=request.id,
        expected_plan_hash="plan-1",
        plan={"waves": []},
        plan_hash="plan-2",
        at=NOW,
    )
    again = approvals.record(
        db,
        request_id=request.id,
        approver="U0APP",
        decision="approve",
        plan_hash="plan-2",
        at=NOW + HOUR,
    )

    assert again is not None
    assert approvals.for_request(db, request_id=request.id, plan_hash="plan-2") == [again]
    assert requests.get(db, id=request.id).plan == {"waves": []}


def test_an_approval_for_an_unknown_request_is_refused_by_the_foreign_key(db):
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        approvals.record(
            db,
            request_id=RequestId("req-nope00"),
            approver="U0APP",
            decision="approve",
            plan_hash="plan-1",
            at=NOW,
        )


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_the_requester_cannot_store_a_decision_on_their_own_request(db, decision):
    request = new_request(db)

    with pytest.raises(ConstraintViolated, match="requester cannot decide on it"):
        approvals.record(db, request_id=request.id, approver="U0REQ", decision=decision,
                         plan_hash="plan-1", at=NOW)

    assert approvals.for_request(db, request_id=request.id) == []
    assert approvals.record(db, request_id=request.id, approver="U0APP", decision=decision,
                            plan_hash="plan-1", at=NOW) is not None


def test_a_decision_cannot_be_moved_onto_the_requester_afterwards(db):
    request = new_request(db)
    approvals.record(db, request_id=request.id, approver="U0APP", decision="approve", plan_hash="plan-1", at=NOW)

    with pytest.raises(ConstraintViolated, match="requester cannot decide on it"):
        db.execute("UPDATE approvals SET approver = 'U0REQ'")

    assert [a.approver for a in approvals.for_request(db, request_id=request.id)] == ["U0APP"]


def test_a_database_from_before_the_rule_keeps_its_rows_and_refuses_new_self_approvals(db_path):
    with open_database(db_path, migrations=MIGRATIONS[:1]) as old:
        request = new_request(old)
        approvals.record(old, request_id=request.id, approver="U0REQ", decision="approve", plan_hash="plan-1",
                         at=NOW)

    with open_database(db_path) as upgraded:
        assert upgraded.schema_version == latest_version()
        assert [a.approver for a in approvals.for_request(upgraded, request_id=request.id)] == ["U0REQ"]
        with pytest.raises(ConstraintViolated, match="requester cannot decide on it"):
            approvals.record(upgraded, request_id=request.id, approver="U0REQ", decision="approve",
                             plan_hash="plan-2", at=NOW)


def test_pending_requests_past_their_deadline_are_listed_for_expiry(db):
    late = new_request(db, id="req-000late", expires_at=NOW - HOUR)
    new_request(db, id="req-00fresh", expires_at=NOW + HOUR)
    decided = new_request(db, id="req-decide", expires_at=NOW - HOUR)
    requests.transition(db, id=decided.id, expected="pending", new="approved", at=NOW)

    assert [r.id for r in requests.pending_expired(db, now=NOW)] == [late.id]


def test_requests_can_be_listed_by_state_and_pool_newest_first(db):
    older = new_request(db, id="req-00old0", at=NOW - HOUR)
    newer = new_request(db, id="req-00new0", at=NOW)
    new_request(db, id="req-0other", pool="train-a")

    listed = requests.in_states(db, states=["pending"], pool="serving-a")

    assert [r.id for r in listed] == [newer.id, older.id]


def test_the_first_slack_thread_recorded_for_a_request_sticks(db):
    request = new_request(db)

    assert requests.set_thread(db, id=request.id, channel="C0OPS", thread_ts="1717.0001")
    assert not requests.set_thread(db, id=request.id, channel="C0OPS", thread_ts="1717.0002")
    assert requests.get(db, id=request.id).thread_ts == "1717.0001"


def test_a_bad_kind_is_refused_by_the_schema(db):
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        requests.create(
            db,
            kind="reboot",
            pool="p",
            targets=[],
            window_start=None,
            window_end=None,
            reason="",
            requester="U",
            requester_name="U",
            plan={},
            plan_hash="h",
            approvals_required=1,
            expires_at=NOW,
            at=NOW,
        )


# ------------------------------------------------------------------ runs and steps


def test_a_request_has_at_most_one_unfinished_run(db):
    request = new_request(db)

    first = runs.create(db, request_id=request.id, dry_run=True, at=NOW)
    second = runs.create(db, request_id=request.id, dry_run=False, at=NOW)
    assert first is not None and first.dry_run and first.state == "pending"
    assert second is None

    runs.transition(
        db, id=first.id, expected="pending", new="aborted", at=NOW, halted_reason="dry run done"
    )
    third = runs.create(db, request_id=request.id, dry_run=False, at=NOW + HOUR)
    assert third is not None and not third.dry_run
    assert [r.id for r in runs.for_request(db, request_id=request.id)] == [first.id, third.id]


def test_a_run_for_an_unknown_request_is_refused_by_the_foreign_key(db):
    with pytest.raises(ConstraintViolated, match="FOREIGN KEY"):
        runs.create(db, request_id=RequestId("req-nope00"), dry_run=False, at=NOW)


def test_run_transitions_stamp_the_first_start_the_end_and_why_it_halted(db):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None

    assert runs.transition(db, id=run.id, expected="pending", new="running", at=NOW + HOUR)
    assert runs.transition(
        db,
        id=run.id,
        expected="running",
        new="paused",
        at=NOW + 2 * HOUR,
        halted_reason="capacity floor reached in serving-a",
    )
    assert runs.transition(db, id=run.id, expected="paused", new="running", at=NOW + 3 * HOUR)
    assert not runs.transition(db, id=run.id, expected="paused", new="aborted", at=NOW + 4 * HOUR)
    assert runs.transition(
        db, id=run.id, expected=("running", "paused"), new="succeeded", at=NOW + 5 * HOUR
    )

    done = runs.get(db, id=run.id)
    assert (done.state, done.started_at, done.ended_at) == ("succeeded", NOW + HOUR, NOW + 5 * HOUR)
    assert done.halted_reason == "capacity floor reached in serving-a"
    assert done.finished


def test_what_a_run_waits_for_is_kept_while_it_is_unfinished_and_forgotten_when_it_ends(db):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None and run.waiting is None

    assert runs.set_waiting(db, id=run.id, waiting="Wave 1 waits: max_unavailable")
    assert not runs.set_waiting(db, id=run.id, waiting="Wave 1 waits: max_unavailable")  # no change
    assert runs.get(db, id=run.id).waiting == "Wave 1 waits: max_unavailable"
    assert runs.transition(db, id=run.id, expected="pending", new="running", at=NOW + HOUR)
    assert runs.get(db, id=run.id).waiting == "Wave 1 waits: max_unavailable"
    assert runs.transition(db, id=run.id, expected="running", new="failed", at=NOW + 2 * HOUR)
    assert runs.get(db, id=run.id).waiting is None
    assert not runs.set_waiting(db, id=run.id, waiting="anything")  # a finished run waits for nothing
    assert [r.id for r in runs.ended_since(db, since=NOW + 2 * HOUR)] == [run.id]
    assert runs.ended_since(db, since=NOW + 2 * HOUR, states=("succeeded",)) == []
    assert runs.ended_since(db, since=NOW + 3 * HOUR) == []


def test_the_current_wave_advances_only_from_the_wave_the_engine_saw(db):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None

    assert runs.advance_wave(db, id=run.id, expected_wave=None, wave=0)
    assert not runs.advance_wave(db, id=run.id, expected_wave=None, wave=1)
    assert runs.advance_wave(db, id=run.id, expected_wave=0, wave=1)
    assert runs.get(db, id=run.id).current_wave == 1


def test_unfinished_runs_are_listed_for_the_engine_to_resume(db):
    a = runs.create(db, request_id=new_request(db, id="req-00000a").id, dry_run=False, at=NOW)
    b = runs.create(
        db, request_id=new_request(db, id="req-00000b").id, dry_run=False, at=NOW + HOUR
    )
    c = runs.create(
        db, request_id=new_request(db, id="req-00000c").id, dry_run=False, at=NOW + HOUR
    )
    assert a and b and c
    runs.transition(db, id=b.id, expected="pending", new="running", at=NOW)
    runs.transition(db, id=c.id, expected="pending", new="failed", at=NOW)

    assert [r.id for r in runs.unfinished(db)] == [a.id, b.id]


def test_steps_come_back_pending_in_wave_node_seq_order(db):
    run = runs.create(
        db, request_id=new_request(db).id, dry_run=False, at=NOW, id=RunId("run-000001")
    )
    assert run is not None

    stored = steps.add(
        db,
        run_id=run.id,
        steps=[
            steps.NewStep(wave=1, node="gpu-02", seq=0, kind="cordon"),
            steps.NewStep(wave=0, node="gpu-01", seq=1, kind="evict", detail={"grace": 30}),
            steps.NewStep(wave=0, node="gpu-01", seq=0, kind="cordon"),
        ],
    )

    assert [(s.wave, s.node, s.seq, s.kind) for s in stored] == [
        (0, "gpu-01", 0, "cordon"),
        (0, "gpu-01", 1, "evict"),
        (1, "gpu-02", 0, "cordon"),
    ]
    assert {s.state for s in stored} == {"pending"} and stored[1].detail == {"grace": 30}
    assert [s.node for s in steps.for_run(db, run_id=run.id, wave=1)] == ["gpu-02"]


def test_a_repeated_node_and_seq_within_a_run_is_refused(db):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None

    with pytest.raises(ConstraintViolated, match="UNIQUE"):
        steps.add(
            db,
            run_id=run.id,
            steps=[
                steps.NewStep(wave=0, node="gpu-01", seq=0, kind="cordon"),
                steps.NewStep(wave=0, node="gpu-01", seq=0, kind="evict"),
            ],
        )
    assert steps.for_run(db, run_id=run.id) == []


def test_reading_a_runs_steps_again_sees_every_change_another_connection_wrote(db, db_path):
    """The engine reads its run's steps on every turn, reusing what did not change: a
    state, a time or a control written into a step's detail by another process (`drain
    done`) is seen at the next read, and a step is never read back older than it is."""
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None
    first, second = steps.add(db, run_id=run.id, steps=[
        steps.NewStep(wave=0, node="gpu-01", seq=0, kind="hold", detail={"params": {"released": False}}),
        steps.NewStep(wave=0, node="gpu-02", seq=0, kind="cordon")])
    reads = steps.RunStepReads()
    assert reads.for_run(db, run_id=run.id) == steps.for_run(db, run_id=run.id)

    other = open_database(db_path)
    try:
        assert steps.transition(other, id=first.id, expected="pending", new="running", at=NOW)
        assert steps.replace_detail(other, id=first.id, expected="running", detail={"params": {"released": True}})
        assert steps.transition(other, id=second.id, expected="pending", new="running", at=NOW + HOUR)
    finally:
        other.close()

    again = reads.for_run(db, run_id=run.id)
    assert again == steps.for_run(db, run_id=run.id)
    assert [(s.state, s.started_at, s.detail) for s in again] == [
        ("running", NOW, {"params": {"released": True}}), ("running", NOW + HOUR, {})]
    reads.keep_only([])  # the run let go: the next read decodes it all again, still the same
    assert reads.for_run(db, run_id=run.id) == again


def test_a_retried_step_counts_attempts_and_starts_clean(db):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None
    (step,) = steps.add(
        db, run_id=run.id, steps=[steps.NewStep(wave=0, node="gpu-01", seq=0, kind="evict")]
    )

    assert steps.transition(db, id=step.id, expected="pending", new="running", at=NOW)
    assert steps.transition(
        db,
        id=step.id,
        expected="running",
        new="failed",
        at=NOW + HOUR,
        error="PodDisruptionBudget ml/trainer allows 0 disruptions",
    )
    failed = steps.get(db, id=step.id)
    assert (failed.attempt, failed.ended_at, failed.error) == (
        1,
        NOW + HOUR,
        "PodDisruptionBudget ml/trainer allows 0 disruptions",
    )

    assert steps.transition(db, id=step.id, expected="failed", new="running", at=NOW + 2 * HOUR)
    assert steps.transition(
        db, id=step.id, expected="running", new="done", at=NOW + 3 * HOUR, detail={"evicted": 3}
    )
    done = steps.get(db, id=step.id)
    assert (done.state, done.attempt, done.started_at, done.ended_at, done.error, done.detail) == (
        "done",
        2,
        NOW + 2 * HOUR,
        NOW + 3 * HOUR,
        None,
        {"evicted": 3},
    )


def test_two_engines_racing_to_start_the_same_step_exactly_one_wins(db, db_path):
    run = runs.create(db, request_id=new_request(db).id, dry_run=False, at=NOW)
    assert run is not None
    all_steps = steps.add(
        db,
        run_id=run.id,
        steps=[steps.NewStep(wave=0, node=f"gpu-{n:02d}", seq=0, kind="cordon") for n in range(10)],
    )

    for step in all_steps:
        outcomes = race(
            3,
            db_path,
            lambda own: steps.transition(
                own, id=step.id, expected="pending", new="running", at=NOW
            ),
        )
        assert sorted(outcomes) == [False, False, True]
        assert steps.get(db, id=step.id).attempt == 1


def test_every_state_and_kind_the_code_names_is_accepted_by_the_schema(db):
    previous: str = "pending"
    request = new_request(db)
    for state in get_args(requests.RequestState)[1:]:
        assert requests.transition(db, id=request.id, expected=previous, new=state, at=NOW), state
        previous = state

    run = runs.create(db, request_id=request.id, dry_run=False, at=NOW)
    assert run is not None
    previous = "pending"
    for state in get_args(runs.RunState)[1:]:
        assert runs.transition(db, id=run.id, expected=previous, new=state, at=NOW), state
        previous = state

    kinds = KINDS.step_kinds
    stored = steps.add(
        db,
        run_id=run.id,
        steps=[steps.NewStep(wave=0, node="gpu-01", seq=i, kind=k) for i, k in enumerate(kinds)],
    )
    previous = "pending"
    for state in get_args(steps.StepState)[1:]:
        assert steps.transition(db, id=stored[0].id, expected=previous, new=state, at=NOW), state
        previous = state

    for kind in get_args(outbox.MessageKind):
        assert outbox.enqueue(db, channel="C0OPS", kind=kind, payload={}, at=NOW) is not None
    for decision in get_args(approvals.Decision):
        assert approvals.record(
            db,
            request_id=request.id,
            approver=f"U-{decision}",
            decision=decision,
            plan_hash="plan-1",
            at=NOW,
        )


# ------------------------------------------------------------------ idempotency


def test_a_key_is_new_the_first_time_and_seen_every_time_after(db):
    assert idempotency.remember(db, key="Ev01", scope="envelope", at=NOW)
    assert not idempotency.remember(db, key="Ev01", scope="envelope", at=NOW + HOUR)
    assert idempotency.recall(db, key="Ev01", scope="envelope").created_at == NOW


def test_the_same_key_in_different_scopes_is_remembered_separately(db):
    assert idempotency.remember(db, key="abc", scope="envelope", at=NOW)
    assert idempotency.remember(db, key="abc", scope="button", at=NOW)


def test_remembering_from_many_threads_with_separate_connections_is_new_exactly_once(db_path):
    keys = [f"retry-{n}" for n in range(40)]

    outcomes = race(
        8,
        db_path,
        lambda own: [idempotency.remember(own, key=k, scope="slack-retry", at=NOW) for k in keys],
    )

    per_key = [sum(thread[i] for thread in outcomes) for i in range(len(keys))]
    assert per_key == [1] * len(keys)


def test_a_result_can_be_stored_and_replayed_for_a_repeat(db):
    idempotency.remember(db, key="B1", scope="button", at=NOW)

    assert idempotency.set_result(db, key="B1", scope="button", result={"reply": "approved"})

    assert idempotency.recall(db, key="B1", scope="button").result == {"reply": "approved"}
    assert idempotency.recall(db, key="B2", scope="button") is None


def test_pruning_forgets_only_keys_older_than_the_cutoff(db):
    idempotency.remember(db, key="old", scope="envelope", at=NOW - 48 * HOUR)
    idempotency.remember(db, key="new", scope="envelope", at=NOW - HOUR)

    assert idempotency.prune(db, older_than=NOW - 24 * HOUR) == 1

    assert idempotency.remember(db, key="old", scope="envelope", at=NOW)
    assert not idempotency.remember(db, key="new", scope="envelope", at=NOW)


# ------------------------------------------------------------------ handovers and kv


def test_a_rotations_shift_gets_one_handover_however_often_the_scheduler_fires(db):
    shift = NOW.replace(hour=8)

    first = handovers.create(
        db,
        rotation="gpu-oncall",
        shift_start=shift,
        channel="C0OPS",
        content={"in_flight": ["req-7f3a2c"]},
    )
    again = handovers.create(
        db, rotation="gpu-oncall", shift_start=shift, channel="C0OPS", content={"in_flight": []}
    )

    assert first is not None and again is None
    assert handovers.for_shift(db, rotation="gpu-oncall", shift_start=shift) == first
    assert handovers.mark_posted(
        db, id=first.id, ts="1717.42", posted_at=shift + HOUR / 4, late=True
    )
    assert not handovers.mark_posted(db, id=first.id, ts="1717.43", posted_at=shift, late=False)
    posted = handovers.latest(db, rotation="gpu-oncall")
    assert (posted.ts, posted.late, posted.posted_at) == ("1717.42", True, shift + HOUR / 4)


def test_the_first_counted_ack_acknowledges_the_handover(db):
    handover = handovers.create(
        db, rotation="gpu-oncall", shift_start=NOW, channel="C0OPS", content={}
    )
    assert handover is not None

    handovers.record_ack(db, handover_id=handover.id, user="U0OUT", at=NOW, counted=False)
    handovers.record_ack(db, handover_id=handover.id, user="U0IN1", at=NOW + HOUR, counted=True)
    handovers.record_ack(db, handover_id=handover.id, user="U0IN2", at=NOW + 2 * HOUR, counted=True)

    acked = handovers.get(db, id=handover.id)
    assert (acked.acked_by, acked.acked_at) == ("U0IN1", NOW + HOUR)
    assert [(a.user, a.counted) for a in handovers.acks(db, handover_id=handover.id)] == [
        ("U0OUT", False),
        ("U0IN1", True),
        ("U0IN2", True),
    ]


def test_kv_stores_replaces_and_deletes_small_values(db):
    assert kv.get(db, key="engine.holder") is None
    kv.put(db, key="engine.holder", value="gpuops-0")
    kv.put(db, key="engine.holder", value="gpuops-1")
    assert kv.get(db, key="engine.holder") == "gpuops-1"
    assert kv.delete(db, key="engine.holder")
    assert not kv.delete(db, key="engine.holder")


@pytest.mark.parametrize(("version", "kind", "params"), [
    (3, "driver-version", {"object": "NVIDIADriver", "name": "d"}),
    (4, "operator-hold", {"nodes": ["gpu-01"]}),
    (4, "operator-upgrade", {"version": "580.95.05"}),
    (5, "gpu-check", {"namespace": "gpuops"}),
    (6, "snapshot", {}),
    (6, "restore", {}),
])
def test_a_migration_that_widens_the_step_kinds_keeps_every_step_and_lets_a_run_use_the_new_one(
        db_path, version, kind, params):
    at = dt.datetime(2026, 12, 4, 9, 0, tzinfo=dt.timezone.utc)
    with open_database(db_path, migrations=MIGRATIONS[:version - 1]) as old:
        request = requests.create(old, kind="upgrade", pool="train-a", targets=["gpu-01"], window_start=None,
                                  window_end=None, reason="x", requester="U0OTTO", requester_name="Otto",
                                  plan={"format": 1}, plan_hash="a" * 64, approvals_required=0, expires_at=at, at=at)
        run = runs.create(old, request_id=request.id, dry_run=False, at=at)
        before = steps.add(old, run_id=run.id, steps=[steps.NewStep(0, "gpu-01", 0, "cordon"),
                                                      steps.NewStep(0, "gpu-01", 1, "driver", {"version": "580.95.05"})])
        steps.transition(old, id=before[0].id, expected="pending", new="done", at=at)
        with pytest.raises(ConstraintViolated):  # the version before does not know the kind
            old.execute("UPDATE steps SET kind = ? WHERE id = ?", [kind, before[1].id])

    with open_database(db_path, migrations=MIGRATIONS[:version]) as db:
        assert db.schema_version == version
        kept = steps.for_run(db, run_id=run.id)
        assert [(s.id, s.kind, s.state, s.detail) for s in kept] == [
            (before[0].id, "cordon", "done", {}), (before[1].id, "driver", "pending", {"version": "580.95.05"})]
        added = steps.add(db, run_id=run.id, steps=[steps.NewStep(0, "gpu-01", 2, kind, params)])[-1]
        assert added.kind == kind
        with pytest.raises(ConstraintViolated):
            db.execute("UPDATE steps SET kind = 'reboot' WHERE id = ?", [added.id])


def test_the_migration_that_widens_request_kinds_keeps_every_request_its_approvals_and_the_two_person_rule(db_path):
    at = dt.datetime(2026, 12, 4, 9, 0, tzinfo=dt.timezone.utc)
    with open_database(db_path, migrations=MIGRATIONS[:5]) as old:
        request = requests.create(old, kind="mig", pool="inf", targets=["inf-01"], window_start=None,
                                  window_end=None, reason="x", requester="U0OTTO", requester_name="Otto",
                                  plan={"format": 1}, plan_hash="a" * 64, approvals_required=2, expires_at=at, at=at)
        old.execute("INSERT INTO approvals (request_id, approver, decision, plan_hash, created_at) "
                    "VALUES (?, 'U0BOB', 'approve', ?, ?)", [request.id, "a" * 64, "2026-12-04T09:00:00Z"])
        with pytest.raises(ConstraintViolated):
            requests.create(old, kind="migrate", pool="inf", targets=["inf-01"], window_start=None, window_end=None,
                            reason="x", requester="U0OTTO", requester_name="Otto", plan={"format": 1},
                            plan_hash="b" * 64, approvals_required=1, expires_at=at, at=at)

    with open_database(db_path, migrations=MIGRATIONS[:6]) as db:
        assert db.schema_version == 6
        kept = requests.get(db, id=request.id)
        assert kept is not None and (kept.kind, kept.pool) == ("mig", "inf")
        assert db.execute("SELECT count(*) FROM approvals WHERE request_id = ?", [request.id]).fetchone()[0] == 1
        moved = requests.create(db, kind="migrate", pool="inf", targets=["inf-01"], window_start=None,
                                window_end=None, reason="x", requester="U0OTTO", requester_name="Otto",
                                plan={"format": 1}, plan_hash="b" * 64, approvals_required=1, expires_at=at, at=at)
        assert moved.kind == "migrate"
        # The approvals table still points at requests (its key and the two-person trigger).
        with pytest.raises(ConstraintViolated):
            db.execute("INSERT INTO approvals (request_id, approver, decision, plan_hash, created_at) "
                       "VALUES ('nope', 'U0BOB', 'approve', ?, ?)", ["a" * 64, "2026-12-04T09:00:00Z"])
        with pytest.raises(ConstraintViolated, match="two-person rule"):
            db.execute("INSERT INTO approvals (request_id, approver, decision, plan_hash, created_at) "
                       "VALUES (?, 'U0OTTO', 'approve', ?, ?)", [moved.id, "b" * 64, "2026-12-04T09:00:00Z"])
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
