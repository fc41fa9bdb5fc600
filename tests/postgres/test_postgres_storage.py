"""What PostgreSQL must do as SQLite does, told in its own words: the schema is SQLite's
(same tables, columns, NOT NULLs, unique keys, kinds), writers from several processes
keep one audit chain, openers apply each migration once, a too-new or a foreign database
is refused untouched, and the URL's password is never shown."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import multiprocessing
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from storage import audit, kv, outbox, postgres_backend
from storage.database import Database, PerThreadDatabase, open_database
from storage.errors import (
    ConstraintViolated,
    DatabaseUnavailable,
    MigrationFailed,
    NotAGpuopsDatabase,
    SchemaTooNew,
)
from storage.migrations import MIGRATIONS, latest_version
from storage.migrations_pg import MIGRATIONS_PG, PostgresMigration
from tests.postgres.raw import RawPostgres
from testenv.postgres import PASSWORD, PostgresServer

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


def append(db: Database, n: int, *, actor: str = "U0ADA") -> audit.AuditEntry:
    return audit.append(db, actor=actor, k8s_identity=None, action="request.approve", target=f"request/req-{n:06d}",
                        at=NOW + dt.timedelta(seconds=n))


# ------------------------------------------------------------------ one schema in two words


def _sqlite_shape(path: Path) -> dict[str, Any]:
    raw = sqlite3.connect(path)
    try:
        tables = [r[0] for r in raw.execute("SELECT name FROM sqlite_schema WHERE type = 'table'"
                                            " AND name NOT LIKE 'sqlite_%'")]
        columns = {t: {r[1]: bool(r[3] or r[5]) for r in raw.execute(f'PRAGMA table_info("{t}")')} for t in tables}
        unique: dict[str, set[tuple[str, ...]]] = {t: set() for t in tables}
        for t in tables:
            for index in raw.execute(f'PRAGMA index_list("{t}")'):
                if index[2] and not index[4]:  # unique and not partial
                    unique[t].add(tuple(sorted(r[2] for r in raw.execute(f'PRAGMA index_info("{index[1]}")'))))
            keys = tuple(sorted(r[1] for r in raw.execute(f'PRAGMA table_info("{t}")') if r[5]))
            if keys:
                unique[t].add(keys)
        kinds = {t: sorted(r[0] for r in raw.execute(f"SELECT name FROM {t}")) for t in ("request_kinds", "step_kinds")}
    finally:
        raw.close()
    return {"columns": columns, "unique": unique, "kinds": kinds}


def _postgres_shape(url: str) -> dict[str, Any]:
    raw = RawPostgres(url)
    try:
        tables = [r[0] for r in raw.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " AND table_name <> 'gpuops_schema'")]
        columns = {t: {r[0]: r[1] == "NO" for r in raw.execute(
            "SELECT column_name, is_nullable FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ?", (t,))} for t in tables}
        unique: dict[str, set[tuple[str, ...]]] = {t: set() for t in tables}
        for table, names in raw.execute(
                "SELECT i.indrelid::regclass::text, array_agg(a.attname::text) FROM pg_index i"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                " WHERE i.indisunique AND i.indpred IS NULL"
                " AND i.indrelid::regclass::text IN (SELECT table_name FROM information_schema.tables"
                "   WHERE table_schema = current_schema())"
                " GROUP BY i.indexrelid, i.indrelid"):
            if table in unique:
                unique[table].add(tuple(sorted(names)))
        kinds = {t: sorted(r[0] for r in raw.execute(f"SELECT name FROM {t}")) for t in ("request_kinds", "step_kinds")}
    finally:
        raw.close()
    return {"columns": columns, "unique": unique, "kinds": kinds}


def test_both_migration_lists_end_at_the_same_version():
    assert MIGRATIONS_PG[-1].version == latest_version(MIGRATIONS)


def test_both_schemas_have_the_same_tables_columns_not_nulls_unique_keys_and_kinds(tmp_path, postgres_url):
    open_database(tmp_path / "gpuops.db").close()
    sqlite_shape = _sqlite_shape(tmp_path / "gpuops.db")
    postgres_shape = _postgres_shape(postgres_url)

    assert sorted(postgres_shape["columns"]) == sorted(sqlite_shape["columns"])
    for table, columns in sqlite_shape["columns"].items():
        assert postgres_shape["columns"][table] == columns, table
    assert postgres_shape["unique"] == sqlite_shape["unique"]
    assert postgres_shape["kinds"] == sqlite_shape["kinds"]


def test_tables_come_after_the_tables_they_reference_on_both(tmp_path, db):
    with open_database(tmp_path / "gpuops.db") as on_sqlite:
        assert sorted(on_sqlite.tables()) == sorted(db.tables())
        for each in (on_sqlite, db):
            order = each.tables()
            assert order.index("request_kinds") < order.index("requests") < order.index("approvals")
            assert order.index("runs") < order.index("steps") and order.index("handovers") < order.index(
                "handover_acks")
            assert "schema_migrations" not in order and "gpuops_schema" not in order


def test_after_rows_copied_with_their_ids_new_rows_continue_past_them(db):
    db.execute("INSERT INTO outbox (id, created_at, channel, kind, payload, next_attempt_at)"
               " VALUES (?, ?, ?, ?, ?, ?)", (41, "2025-06-07T12:00:00.000000Z", "C0OPS", "post", "{}",
                                              "2025-06-07T12:00:00.000000Z"))
    db.restart_identities()

    queued = outbox.enqueue(db, channel="C0OPS", kind="post", payload={"text": "next"}, at=NOW)

    assert queued is not None and queued.id == 42


# ------------------------------------------------------------------ the triggers, raw


@pytest.mark.parametrize("statement", ["UPDATE audit SET actor = 'U0EVE' WHERE seq = 1", "DELETE FROM audit",
                                       "TRUNCATE audit"])
def test_changing_the_audit_behind_gpuops_is_refused_in_the_same_words(db, postgres_url, statement):
    append(db, 1)
    append(db, 2)
    raw = RawPostgres(postgres_url)
    try:
        with pytest.raises(Exception, match="audit is append-only"):
            raw.execute(statement)
    finally:
        raw.close()

    assert audit.verify(db).ok and audit.verify(db).checked == 2


def test_a_refused_write_inside_a_transaction_leaves_the_rest_of_it_to_commit(db):
    # SQLite undoes only the failed statement; PostgreSQL would end the transaction.
    with db.transaction():
        append(db, 1)
        with pytest.raises(ConstraintViolated, match="audit is append-only"):
            db.execute("DELETE FROM audit")
        append(db, 2)

    assert audit.verify(db).checked == 2


# ------------------------------------------------------------------ several writers, one chain


def _append_from_a_process(url: str, worker: int, count: int, start: Any) -> None:
    with open_database(url) as db:
        start.wait()  # every process connected: they append at the same time
        for n in range(count):
            append(db, worker * 1000 + n, actor=f"U0W{worker}")


def test_appenders_in_several_processes_keep_one_verifiable_chain(db, postgres_url):
    spawning = multiprocessing.get_context("spawn")
    start = spawning.Barrier(3)
    processes = [spawning.Process(target=_append_from_a_process, args=(postgres_url, worker, 15, start))
                 for worker in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0

    seqs = [r["seq"] for r in db.query("SELECT seq FROM audit ORDER BY seq")]
    assert seqs == list(range(1, 46))
    assert audit.verify(db) == audit.VerifyResult(ok=True, checked=45, first_bad_seq=None, problem=None)


def test_appenders_in_several_threads_keep_one_verifiable_chain(db, postgres_url):
    shared = PerThreadDatabase(postgres_url)

    def work(worker: int) -> None:
        try:
            for n in range(10):
                append(shared.get(), worker * 1000 + n)
        finally:
            shared.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))

    assert audit.verify(db) == audit.VerifyResult(ok=True, checked=40, first_bad_seq=None, problem=None)


# ------------------------------------------------------------------ opening and refusing


def _schema_rows(url: str) -> tuple[list[Any], list[Any], list[Any]]:
    raw = RawPostgres(url)
    try:
        return (raw.execute("SELECT * FROM gpuops_schema").fetchall(),
                raw.execute("SELECT * FROM schema_migrations ORDER BY version").fetchall(),
                sorted(r[0] for r in raw.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")))
    finally:
        raw.close()


def test_a_second_opener_of_a_migrated_database_applies_nothing(db, postgres_url):
    before = _schema_rows(postgres_url)

    with open_database(postgres_url, now=lambda: NOW + dt.timedelta(days=1)) as again:
        assert again.schema_version == MIGRATIONS_PG[-1].version

    assert _schema_rows(postgres_url) == before


def test_openers_of_a_new_database_at_once_apply_each_migration_exactly_once(postgres_server: PostgresServer):
    url = postgres_server.url(postgres_server.create_database())
    start = threading.Barrier(4)

    def open_one(_: int) -> int:
        start.wait()
        with open_database(url) as opened:
            return opened.schema_version

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(open_one, range(4))) == [MIGRATIONS_PG[-1].version] * 4
    assert [row[0] for row in _schema_rows(url)[1]] == [m.version for m in MIGRATIONS_PG]


def test_a_database_from_a_newer_gpuops_is_refused_and_left_untouched(db, postgres_url):
    append(db, 1)
    raw = RawPostgres(postgres_url)
    raw.execute("UPDATE gpuops_schema SET version = 99")
    raw.close()
    before = _schema_rows(postgres_url)

    with pytest.raises(SchemaTooNew, match="schema version 99, this gpuops knows up to 15"):
        open_database(postgres_url, request_kinds=("a-kind-nobody-has",))

    assert _schema_rows(postgres_url) == before


def test_another_programs_database_is_refused_and_left_untouched(postgres_server: PostgresServer):
    url = postgres_server.url(postgres_server.create_database())
    raw = RawPostgres(url)
    raw.execute("CREATE TABLE customers (id integer PRIMARY KEY)")
    raw.close()

    with pytest.raises(NotAGpuopsDatabase, match="1 tables but no gpuops_schema mark"):
        open_database(url)

    raw = RawPostgres(url)
    try:
        assert [r[0] for r in raw.execute("SELECT table_name FROM information_schema.tables"
                                          " WHERE table_schema = current_schema()")] == ["customers"]
    finally:
        raw.close()


def test_a_failing_migration_rolls_back_entirely_and_keeps_the_version(db, postgres_url):
    broken = (*MIGRATIONS_PG, PostgresMigration(16, "a table, then a failure",
                                                "CREATE TABLE half_made (a integer); SELECT 1 / 0;"))
    before = _schema_rows(postgres_url)

    with pytest.raises(MigrationFailed, match="unchanged at version 15"):
        open_database(postgres_url, migrations=broken)

    assert _schema_rows(postgres_url) == before


# ------------------------------------------------------------------ the password


def test_the_password_never_shows_in_repr_str_or_messages(db, postgres_url, postgres_server, caplog):
    caplog.set_level(logging.DEBUG)
    assert PASSWORD in postgres_url
    shown = [repr(db), str(db.target), repr(PerThreadDatabase(postgres_url)), PerThreadDatabase(postgres_url).target]
    with pytest.raises(DatabaseUnavailable) as refused:
        open_database(postgres_server.url("postgres", password=PASSWORD + "-wrong"))
    shown.append(str(refused.value))
    raw = RawPostgres(postgres_url)
    raw.execute("UPDATE gpuops_schema SET version = 99")
    raw.close()
    with pytest.raises(SchemaTooNew) as too_new:
        open_database(postgres_url)
    shown.append(str(too_new.value))

    assert all(PASSWORD not in text for text in shown), shown
    assert "gpuops:***@127.0.0.1" in repr(db)
    assert PASSWORD not in caplog.text
    # The driver's own exception (which may quote the connection string) is not chained.
    assert refused.value.__suppress_context__ and refused.value.__cause__ is None


def test_a_percent_in_quoted_text_reaches_the_database_as_written(db):
    db.execute("INSERT INTO kv (key, value) VALUES (?, '50% done')", ("progress",))

    assert db.query_one("SELECT value FROM kv WHERE key = ? AND value LIKE '50%'", ("progress",)) == {
        "value": "50% done"}


def test_a_broken_constraint_reads_in_sqlites_words_on_postgresql_too(db):
    with pytest.raises(ConstraintViolated, match="NOT NULL constraint failed"):
        db.execute("INSERT INTO kv (key, value) VALUES (?, ?)", ("k", None))
    with pytest.raises(ConstraintViolated, match="UNIQUE constraint failed"):
        db.execute("INSERT INTO kv (key, value) VALUES (?, ?), (?, ?)", ("k", "1", "k", "2"))


def test_a_writer_kept_waiting_past_the_lock_timeout_is_unavailable_as_on_sqlite(postgres_url, monkeypatch):
    monkeypatch.setattr(postgres_backend, "WRITE_WAIT", dt.timedelta(milliseconds=200))
    holder = RawPostgres(postgres_url)
    try:
        with open_database(postgres_url) as db:
            holder.execute("BEGIN")
            holder.execute("SELECT pg_advisory_xact_lock(?)", (postgres_backend.WRITER_LOCK_KEY,))
            with pytest.raises(DatabaseUnavailable, match="lock timeout"), db.transaction():
                kv.put(db, key="k", value="v")
            assert not db.in_transaction
            holder.execute("ROLLBACK")
            with db.transaction():
                kv.put(db, key="k", value="v")
            assert kv.get(db, key="k") == "v"
    finally:
        holder.close()


# ------------------------------------------------------------------ a connection the server drops


def _cut(db: Database, postgres_url: str) -> None:
    """What a server restart, a failover or an idle-connection reaper does to `db`'s connection."""
    pid = db.query_one("SELECT pg_backend_pid() AS pid", ())
    assert pid is not None
    admin = RawPostgres(postgres_url)
    try:
        assert admin.execute("SELECT pg_terminate_backend(?)", (pid["pid"],)).fetchone() == (True,)
    finally:
        admin.close()


def test_a_connection_the_server_dropped_costs_one_statement_and_the_next_reconnects(db, postgres_url, caplog):
    kv.put(db, key="before", value="kept")
    _cut(db, postgres_url)

    with pytest.raises(DatabaseUnavailable):
        kv.get(db, key="before")  # the statement that finds the connection gone
    with caplog.at_level(logging.INFO, logger="storage.postgres_backend"):
        assert kv.get(db, key="before") == "kept"
        with db.transaction():
            kv.put(db, key="after", value="written")
        assert kv.get(db, key="after") == "written"
    assert [r.getMessage() for r in caplog.records] == [f"reconnected to {db.target}"]  # once, not per statement


def test_a_transaction_whose_connection_is_dropped_mid_way_commits_nothing_and_never_continues_on_a_new_one(
        db, postgres_url):
    with pytest.raises(DatabaseUnavailable), db.transaction():
        kv.put(db, key="first", value="1")
        _cut(db, postgres_url)
        with pytest.raises(DatabaseUnavailable):  # found lost; a caller that carries on...
            kv.put(db, key="second", value="2")
        with db.transaction():  # ...is in the lost transaction still, never a new one on a new connection
            kv.put(db, key="third", value="3")

    assert not db.in_transaction
    assert [kv.get(db, key=k) for k in ("first", "second", "third")] == [None, None, None]
    with db.transaction():
        kv.put(db, key="fourth", value="4")
    assert kv.get(db, key="fourth") == "4"


def test_a_connection_gives_up_on_a_server_that_falls_silent_unless_the_url_says_otherwise(postgres_url):
    """A lost node sends no reset: without keepalives and a TCP user timeout a statement on
    its connection would wait a quarter of an hour for the kernel to give up."""
    def parameters(url: str) -> dict[str, str]:
        with open_database(url) as db:
            return db._backend._conn.info.get_parameters()  # type: ignore[attr-defined]

    given = parameters(postgres_url)
    assert (given.get("keepalives"), given.get("keepalives_idle"), given.get("tcp_user_timeout")) == ("1", "10",
                                                                                                     "20000")
    joiner = "&" if "?" in postgres_url else "?"
    own = parameters(f"{postgres_url}{joiner}tcp_user_timeout=5000&keepalives_idle=30")
    assert (own.get("tcp_user_timeout"), own.get("keepalives_idle"), own.get("keepalives_count")) == ("5000", "30",
                                                                                                     "3")
