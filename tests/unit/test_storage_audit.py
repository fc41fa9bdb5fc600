"""The audit log: append-only by trigger, tamper-evident by hash chain and anchor.

Tampering is done the way an intruder with file access would: a plain sqlite3
connection, triggers dropped first.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import approvals as stored_approvals
from storage import audit, kv
from storage import freezes as stored_freezes
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.database import Database, open_database
from storage.ids import RequestId, RunId

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
MINUTE = dt.timedelta(minutes=1)


def write_rows(db: Database, count: int) -> list[audit.AuditEntry]:
    return [
        audit.append(
            db,
            actor="U0ADA" if n % 2 else "gpuops",
            k8s_identity=None if n % 2 else "system:serviceaccount:gpuops:gpuops",
            action="step.done" if n % 2 == 0 else "request.approve",
            target=f"node/gpu-h100-{n:02d}",
            request_id=RequestId("req-7f3a2c"),
            run_id=RunId("run-9b01de") if n % 2 == 0 else None,
            before={"unschedulable": False},
            after={"unschedulable": True, "by": "gpuops"},
            detail={"wave": n // 2, "note": "naïve ünïcode is fine"},
            at=NOW + n * MINUTE,
        )
        for n in range(1, count + 1)
    ]


@pytest.fixture
def tamper(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A raw connection with the append-only triggers dropped."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("DROP TRIGGER audit_no_update")
    raw.execute("DROP TRIGGER audit_no_delete")
    yield raw
    raw.close()


# ------------------------------------------------------------------ writing and reading


def test_an_empty_log_verifies(db):
    assert audit.verify(db) == audit.VerifyResult(
        ok=True, checked=0, first_bad_seq=None, problem=None
    )


def test_an_untouched_chain_verifies_every_row(db):
    write_rows(db, 5)

    assert audit.verify(db) == audit.VerifyResult(
        ok=True, checked=5, first_bad_seq=None, problem=None
    )


def test_each_row_hashes_the_previous_hash_and_the_canonical_json_of_its_fields(db):
    first, second = write_rows(db, 2)

    fields = {
        "seq": 1,
        "at": "2025-06-07T12:01:00.000000Z",
        "actor": "U0ADA",
        "k8s_identity": None,
        "action": "request.approve",
        "target": "node/gpu-h100-01",
        "request_id": "req-7f3a2c",
        "run_id": None,
        "before": {"unschedulable": False},
        "after": {"by": "gpuops", "unschedulable": True},
        "detail": {"note": "naïve ünïcode is fine", "wave": 0},
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert first.prev_hash == audit.GENESIS == "0" * 64
    assert first.hash == hashlib.sha256((audit.GENESIS + canonical).encode()).hexdigest()
    assert second.prev_hash == first.hash
    assert audit.head_of(db) == audit.AuditHead(seq=2, hash=second.hash)


def test_recent_is_newest_first_and_for_request_is_oldest_first(db):
    rows = write_rows(db, 4)
    audit.append(
        db,
        actor="U0BOB",
        k8s_identity=None,
        action="request.create",
        target="pool/train-a",
        request_id=RequestId("req-000002"),
        at=NOW,
    )

    assert [e.seq for e in audit.recent(db, 2)] == [5, 4]
    assert audit.for_request(db, RequestId("req-7f3a2c")) == rows
    assert [e.seq for e in audit.for_run(db, RunId("run-9b01de"))] == [2, 4]
    assert rows[0].at == NOW + MINUTE and rows[0].after == {"unschedulable": True, "by": "gpuops"}


def test_appends_from_many_threads_form_one_unbroken_chain(db, db_path):
    barrier = threading.Barrier(4)

    def work(worker: int) -> None:
        with open_database(db_path) as own:
            barrier.wait()
            for n in range(25):
                audit.append(
                    own,
                    actor=f"U{worker}",
                    k8s_identity=None,
                    action="test.append",
                    target=f"n{n}",
                    at=NOW,
                )

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert audit.verify(db) == audit.VerifyResult(
        ok=True, checked=100, first_bad_seq=None, problem=None
    )


# ------------------------------------------------------------------ the triggers


def test_updating_an_audit_row_through_sql_is_refused(db, db_path):
    write_rows(db, 2)
    raw = sqlite3.connect(db_path, isolation_level=None)

    with pytest.raises(sqlite3.IntegrityError, match="audit is append-only"):
        raw.execute("UPDATE audit SET actor = 'U0EVE' WHERE seq = 1")
    raw.close()

    assert audit.verify(db).ok


def test_deleting_an_audit_row_through_sql_is_refused(db, db_path):
    write_rows(db, 2)
    raw = sqlite3.connect(db_path, isolation_level=None)

    with pytest.raises(sqlite3.IntegrityError, match="audit is append-only"):
        raw.execute("DELETE FROM audit")
    raw.close()

    assert audit.verify(db).checked == 2


# ------------------------------------------------------------------ tampering past the triggers


def test_a_changed_field_is_detected_even_with_the_triggers_dropped(db, tamper):
    write_rows(db, 5)

    tamper.execute("UPDATE audit SET actor = 'U0EVE' WHERE seq = 3")

    result = audit.verify(db)
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert (
        result.problem
        == "audit row 3 was changed after it was written (its hash no longer matches)"
    )


def test_a_changed_json_value_is_detected_but_reformatted_json_is_not_a_change(db, tamper):
    write_rows(db, 3)

    tamper.execute(
        """UPDATE audit SET "after" = '{ "by" : "gpuops", "unschedulable" : true }' WHERE seq = 1"""
    )
    assert audit.verify(db).ok

    tamper.execute(
        """UPDATE audit SET "after" = '{"by":"gpuops","unschedulable":false}' WHERE seq = 2"""
    )
    assert audit.verify(db).first_bad_seq == 2


def test_a_deleted_middle_row_is_detected(db, tamper):
    write_rows(db, 5)

    tamper.execute("DELETE FROM audit WHERE seq = 3")

    result = audit.verify(db)
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert result.problem == "audit row 3 is missing (rows jump from 2 to 4)"


def test_a_deleted_middle_row_with_later_rows_renumbered_is_detected(db, tamper):
    write_rows(db, 5)

    tamper.execute("DELETE FROM audit WHERE seq = 3")
    tamper.execute("UPDATE audit SET seq = seq - 1 WHERE seq > 3")

    result = audit.verify(db)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "does not chain from row 2" in result.problem


def test_a_deleted_last_row_is_detected_through_the_anchor(db, tamper):
    write_rows(db, 5)

    tamper.execute("DELETE FROM audit WHERE seq >= 4")

    result = audit.verify(db)
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 3, 4)
    assert (
        result.problem
        == "audit rows 4-5 are missing from the end (the anchor says the log ends there)"
    )


def test_an_append_after_a_truncation_does_not_hide_it(db, tamper):
    write_rows(db, 5)
    tamper.execute("DELETE FROM audit WHERE seq = 5")

    entry = audit.append(
        db, actor="gpuops", k8s_identity=None, action="run.resume", target="run/x", at=NOW
    )

    assert entry.seq == 6
    result = audit.verify(db)
    assert (result.ok, result.first_bad_seq) == (False, 5)
    assert result.problem == "audit row 5 is missing (rows jump from 4 to 6)"


def test_a_deleted_anchor_is_detected(db, tamper):
    write_rows(db, 3)

    tamper.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))

    result = audit.verify(db)
    assert not result.ok and "anchor" in result.problem


def test_reordered_rows_are_detected(db, tamper):
    write_rows(db, 5)

    # Swap the contents of rows 2 and 3, keeping seq numbers dense.
    tamper.execute("UPDATE audit SET seq = -2 WHERE seq = 2")
    tamper.execute("UPDATE audit SET seq = 2 WHERE seq = 3")
    tamper.execute("UPDATE audit SET seq = 3 WHERE seq = -2")

    result = audit.verify(db)
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 1, 2)
    assert result.problem == (
        "audit row 2 does not chain from row 1: rows were deleted, inserted or reordered"
    )


def test_rows_slipped_in_behind_gpuops_are_detected_even_with_valid_hashes(db, tamper):
    *_, last = write_rows(db, 3)
    fields = {
        "seq": 4,
        "at": "2025-06-07T13:00:00.000000Z",
        "actor": "U0EVE",
        "k8s_identity": None,
        "action": "request.approve",
        "target": "req-7f3a2c",
        "request_id": None,
        "run_id": None,
        "before": None,
        "after": None,
        "detail": None,
    }
    forged = audit._chain_hash(last.hash, fields)

    tamper.execute(
        "INSERT INTO audit (seq, at, actor, action, target, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (4, fields["at"], "U0EVE", "request.approve", "req-7f3a2c", last.hash, forged),
    )

    result = audit.verify(db)
    assert (result.ok, result.first_bad_seq) == (False, 4)
    assert result.problem == (
        "audit row 4 was added without going through gpuops "
        "(the anchor says the log ends at row 3)"
    )


def test_a_fully_rewritten_chain_is_caught_by_a_head_published_elsewhere(db, tamper):
    write_rows(db, 4)
    published = audit.head_of(db)

    # Someone who knows the algorithm changes row 2, re-hashes rows 2..4 and the anchor.
    tamper.execute("UPDATE audit SET actor = 'U0EVE' WHERE seq = 2")
    previous = tamper.execute("SELECT hash FROM audit WHERE seq = 1").fetchone()[0]
    for seq in (2, 3, 4):
        row = db.query_one("SELECT * FROM audit WHERE seq = ?", (seq,))
        digest = audit._chain_hash(previous, audit._hashed_fields(row))
        tamper.execute(
            "UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?", (previous, digest, seq)
        )
        previous = digest
    kv.put(db, key=audit.ANCHOR_KEY, value=json.dumps({"seq": 4, "hash": previous}))

    assert audit.verify(db).ok  # nothing inside the file can tell
    result = audit.verify(db, expected=published)
    assert (result.ok, result.first_bad_seq) == (False, 4)
    assert result.problem == "audit row 4 does not match the head published earlier"


def test_a_published_head_beyond_the_end_of_the_log_is_reported(db, tamper):
    write_rows(db, 4)
    published = audit.head_of(db)
    tamper.execute("DELETE FROM audit WHERE seq = 4")
    kv.put(
        db, key=audit.ANCHOR_KEY, value=json.dumps({"seq": 3, "hash": audit.recent(db, 1)[0].hash})
    )

    result = audit.verify(db, expected=published)

    assert (result.ok, result.first_bad_seq) == (False, 4)
    assert "ends at row 3" in result.problem


@pytest.mark.parametrize("garbage", ['{"wave": 1e400}', '[1e999, -1e999]', '{"broken": tru'])
def test_a_row_that_cannot_be_read_is_broken_at_its_entry_not_a_crash(db, tamper, garbage):
    write_rows(db, 3)
    tamper.execute("PRAGMA ignore_check_constraints = ON")

    tamper.execute("UPDATE audit SET detail = ? WHERE seq = 2", (garbage,))

    result = audit.verify(db)
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 1, 2)
    assert result.problem.startswith("audit row 2 cannot be read, so it was changed after it was written")


@pytest.mark.parametrize("garbage", ["not json", "[]", '{"seq": "4", "hash": "x"}', '{"seq": 4}', "null",
                                     '{"seq": 1e400, "hash": "x"}'])
def test_a_garbage_anchor_is_broken_at_the_last_entry_not_a_crash(db, garbage):
    write_rows(db, 3)

    kv.put(db, key=audit.ANCHOR_KEY, value=garbage)

    result = audit.verify(db)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert result.problem.startswith(f"the audit anchor ({audit.ANCHOR_KEY}) cannot be read")


def _decided_request(db: Database) -> stored_requests.Request:
    request = stored_requests.create(
        db, kind="drain", pool="serving-a", targets=["gpu-1"], window_start=None, window_end=None,
        reason="kernel update", requester="U0ALICE", requester_name="alice", plan={}, plan_hash="0" * 64,
        approvals_required=1, expires_at=NOW + 60 * MINUTE, at=NOW)
    assert stored_requests.transition(db, id=request.id, expected="pending", new="approved", at=NOW)
    return request


def test_a_wiped_log_is_broken_when_a_decided_request_has_no_audit_row(db, tamper):
    request = _decided_request(db)
    write_rows(db, 3)

    tamper.execute("DELETE FROM audit")
    tamper.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))

    result = audit.verify(db)
    assert not result.ok
    assert result.problem == f"request {request.id} is approved but no audit row mentions it: its rows were wiped"


def test_a_run_left_out_of_a_rewritten_log_is_reported(db, tamper):
    request = _decided_request(db)
    run = stored_runs.create(db, request_id=request.id, dry_run=False, at=NOW)
    assert run is not None
    tamper.execute("DELETE FROM audit")
    tamper.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))

    # A fresh, valid chain that mentions the request but not its run.
    audit.append(db, actor="U0ALICE", k8s_identity=None, action="request.created", target="serving-a",
                 request_id=request.id, at=NOW)

    result = audit.verify(db)
    assert not result.ok
    assert result.problem == f"run {run.id} is pending but no audit row mentions it: its rows were wiped"


def test_requests_and_runs_with_their_audit_rows_verify_and_a_decided_one_without_is_reported(db):
    request = _decided_request(db)
    run = stored_runs.create(db, request_id=request.id, dry_run=False, at=NOW)
    assert run is not None
    audit.append(db, actor="U0BOB", k8s_identity=None, action="request.approved", target="serving-a",
                 request_id=request.id, at=NOW)
    audit.append(db, actor="U0BOB", k8s_identity=None, action="run.created", target="serving-a",
                 request_id=request.id, run_id=run.id, at=NOW)
    assert audit.verify(db).ok

    later = _decided_request(db)

    assert audit.verify(db).problem == (
        f"request {later.id} is approved but no audit row mentions it: its rows were wiped")


def test_a_head_is_published_as_seq_colon_hash_and_read_back(db):
    write_rows(db, 2)
    head = audit.head_of(db)

    assert head.text == f"2:{head.hash}" and audit.parse_head(head.text) == head
    assert audit.parse_head(f"  2:{head.hash.upper()} ") == head


@pytest.mark.parametrize("text", ["", "2", "2:abc", "x:" + "0" * 64, "-1:" + "0" * 64, "2:" + "g" * 64,
                                  "٢:" + "0" * 64])
def test_a_head_that_is_not_seq_colon_hash_is_refused_with_the_expected_form(text):
    with pytest.raises(audit.BadHead, match="is not an audit head: it is SEQ:HASH"):
        audit.parse_head(text)


# ------------------------------------------------------------------ export


def test_export_writes_one_valid_json_object_per_row_that_re_verifies_offline(db):
    rows = write_rows(db, 3)
    out = io.StringIO()

    assert audit.export_jsonl(db, out) == 3

    lines = out.getvalue().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert records[0]["detail"] == {"wave": 0, "note": "naïve ünïcode is fine"}
    assert set(records[0]) == {
        "seq",
        "at",
        "actor",
        "k8s_identity",
        "action",
        "target",
        "request_id",
        "run_id",
        "before",
        "after",
        "detail",
        "prev_hash",
        "hash",
    }
    previous = audit.GENESIS
    for record, row in zip(records, rows):
        fields = {k: v for k, v in record.items() if k not in ("prev_hash", "hash")}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert (
            hashlib.sha256((previous + canonical).encode()).hexdigest()
            == record["hash"]
            == row.hash
        )
        previous = record["hash"]


def _pending_request(db: Database) -> stored_requests.Request:
    return stored_requests.create(
        db, kind="drain", pool="serving-a", targets=["gpu-1"], window_start=None, window_end=None,
        reason="kernel update", requester="U0ALICE", requester_name="alice", plan={}, plan_hash="0" * 64,
        approvals_required=2, expires_at=NOW + 60 * MINUTE, at=NOW)


def _wipe(tamper: sqlite3.Connection) -> None:
    tamper.execute("DELETE FROM audit")
    tamper.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))


def test_a_wiped_log_beside_a_pending_request_is_broken(db, tamper):
    request = _pending_request(db)
    audit.append(db, actor="U0ALICE", k8s_identity=None, action="request.created", target="serving-a",
                 request_id=request.id, at=NOW)
    _wipe(tamper)

    result = audit.verify(db)

    assert not result.ok
    assert result.problem == f"request {request.id} is pending but no audit row mentions it: its rows were wiped"


def test_an_approval_no_audit_row_mentions_is_broken_even_when_its_request_is_mentioned(db, tamper):
    request = _pending_request(db)
    for actor in ("U0ALICE", "U0BOB"):
        audit.append(db, actor=actor, k8s_identity=None, action="request.approval" if actor == "U0BOB" else
                     "request.created", target="serving-a", request_id=request.id, at=NOW)
    for approver in ("U0BOB", "U0CAROL"):
        stored_approvals.record(db, request_id=request.id, approver=approver, decision="approve",
                                plan_hash=request.plan_hash, at=NOW)

    result = audit.verify(db)

    assert not result.ok
    assert result.problem == (f"the approval of request {request.id} by U0CAROL is stored but no audit row "
                              "mentions it: its rows were wiped")


def test_an_empty_log_beside_a_freeze_is_broken(db, tamper):
    stored_freezes.create(db, target="serving-a", until=NOW + 60 * MINUTE, reason="incident",
                          let_running_finish=False, set_by="U0ERIN", set_by_name="erin", at=NOW)

    result = audit.verify(db)

    assert not result.ok and result.problem == (
        "the audit log is empty but the freezes table holds 1 row: its rows were wiped")
