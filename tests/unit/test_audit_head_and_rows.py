"""What the audit log reads back, exactly: the head a new row chains from (and that the
bot publishes), every field of a row as written, and the words of an anchor that cannot
be read. Tests mutation testing asked for (storage.audit: head_of, _from_row, _anchor)."""

from __future__ import annotations

import datetime as dt

import pytest

from storage import audit, kv
from storage.database import Database
from storage.ids import RequestId, RunId

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


def append(db: Database, n: int, **fields) -> audit.AuditEntry:
    values = dict(actor="U0ADA", k8s_identity=None, action="request.approve", target=f"request/req-{n:06d}",
                  request_id=None, run_id=None, before=None, after=None, detail=None,
                  at=NOW + dt.timedelta(minutes=n))
    return audit.append(db, **{**values, **fields})


def test_the_head_of_an_empty_log_is_genesis(db):
    assert audit.head_of(db) == audit.AuditHead(seq=0, hash=audit.GENESIS)


def test_the_head_is_the_last_row_that_was_written(db):
    append(db, 1)
    last = append(db, 2)

    assert audit.head_of(db) == audit.AuditHead(seq=2, hash=last.hash)


def test_a_log_without_its_anchor_chains_from_its_last_row(db):
    # A database whose anchor is gone (written before there was one, or removed): the
    # head is then the last row itself, which verify reports as a missing anchor.
    append(db, 1)
    last = append(db, 2)
    db.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))

    assert audit.head_of(db) == audit.AuditHead(seq=2, hash=last.hash)


def test_every_field_of_a_row_reads_back_as_written(db):
    written = append(db, 1, actor="gpuops", k8s_identity="system:serviceaccount:gpuops:gpuops",
                     action="node.cordon", target="node/gpu-h100-01", request_id=RequestId("req-7f3a2c"),
                     run_id=RunId("run-9b01de"), before={"unschedulable": False},
                     after={"unschedulable": True}, detail={"wave": 0})

    (read,) = audit.recent(db, 1)
    (by_request,) = audit.for_request(db, RequestId("req-7f3a2c"))

    assert read == written == by_request
    assert (read.k8s_identity, read.request_id, read.run_id) == (
        "system:serviceaccount:gpuops:gpuops", "req-7f3a2c", "run-9b01de")


def test_an_anchor_that_is_not_json_is_reported_with_the_parsers_words(db):
    append(db, 1)
    kv.put(db, key=audit.ANCHOR_KEY, value="not json")

    result = audit.verify(db)

    assert result.problem == (f"the audit anchor ({audit.ANCHOR_KEY}) cannot be read, so it was changed "
                              "(JSONDecodeError: Expecting value: line 1 column 1 (char 0))")


# ------------------------------------------------------------------ verify's whole answer
# Each problem is reported with how many entries were sound before it, the first bad
# entry and the sentence: a report that names the wrong entry sends people to the wrong
# row of a tampered log.


def three_rows(db: Database) -> list[audit.AuditEntry]:
    return [append(db, n) for n in (1, 2, 3)]


def put_anchor(db: Database, seq: int, digest: str) -> None:
    kv.put(db, key=audit.ANCHOR_KEY, value=f'{{"seq": {seq}, "hash": "{digest}"}}')


def test_a_head_published_before_the_first_entry_verifies(db):
    three_rows(db)

    assert audit.verify(db, expected=audit.AuditHead(seq=0, hash=audit.GENESIS)) == audit.VerifyResult(
        ok=True, checked=3, first_bad_seq=None, problem=None)


def test_a_head_published_at_an_entry_still_in_the_chain_verifies(db):
    rows = three_rows(db)

    assert audit.verify(db, expected=audit.AuditHead(seq=2, hash=rows[1].hash)) == audit.VerifyResult(
        ok=True, checked=3, first_bad_seq=None, problem=None)


def test_a_published_head_whose_entry_now_hashes_otherwise_is_reported_at_that_entry(db):
    three_rows(db)

    result = audit.verify(db, expected=audit.AuditHead(seq=2, hash="f" * 64))

    assert (result.ok, result.checked, result.first_bad_seq) == (False, 1, 2)


def test_a_published_head_past_the_end_is_reported_with_both_numbers(db):
    three_rows(db)

    result = audit.verify(db, expected=audit.AuditHead(seq=5, hash="f" * 64))

    assert (result.ok, result.checked, result.first_bad_seq) == (False, 3, 4)
    assert "5" in result.problem and "3" in result.problem


def test_an_unreadable_anchor_is_reported_at_the_last_entry_with_its_reason(db):
    three_rows(db)
    kv.put(db, key=audit.ANCHOR_KEY, value='{"seq": -1, "hash": "x"}')

    assert audit.verify(db) == audit.VerifyResult(
        ok=False, checked=3, first_bad_seq=3,
        problem=f"the audit anchor ({audit.ANCHOR_KEY}) cannot be read, so it was changed "
                "(it holds seq -1 and hash 'x')")


def test_a_missing_anchor_is_reported_with_the_number_of_entries(db):
    three_rows(db)
    db.execute("DELETE FROM kv WHERE key = ?", (audit.ANCHOR_KEY,))

    assert audit.verify(db) == audit.VerifyResult(
        ok=False, checked=3, first_bad_seq=None,
        problem=f"the audit anchor ({audit.ANCHOR_KEY}) is missing although the log has 3 rows")


def test_a_last_entry_the_anchor_does_not_match_is_the_first_bad_one(db):
    three_rows(db)
    put_anchor(db, 3, "0" * 64)

    result = audit.verify(db)

    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert "3" in result.problem


def test_entries_after_the_anchor_are_reported_from_the_first_of_them(db):
    rows = three_rows(db)
    put_anchor(db, 2, rows[1].hash)

    result = audit.verify(db)

    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert "2" in result.problem and "3" in result.problem


def test_a_head_that_does_not_read_is_refused_with_the_whole_form_spelled_out():
    with pytest.raises(audit.BadHead) as refused:
        audit.parse_head("42")

    assert str(refused.value) == ("'42' is not an audit head: it is SEQ:HASH as gpuops publishes it, the entry "
                                  "number, a colon and the 64 hex digits of that entry's hash (e.g. 42:3f9a…)")
