"""What `audit.verify` answers, whole, for the breaks the other audit tests name only in part.

Pinned here, each as the full `VerifyResult` (rows found sound, first bad row, sentence):
- several rows deleted from the middle are named as a range (`rows 3-4`), one deleted from
  the end alone (`row 3`), several added past the anchor as a range (`rows 2-3`);
- a row whose text no longer parses names the parser's error, class and words;
- a row whose seq is not a number (the table rebuilt without its STRICT column) is broken
  at the row after the last good one, not a crash;
- a stored denial no audit row mentions is reported as a denial, with the rows checked;
- an empty log beside a table of several rows says how many rows, in the plural.

Tampering is done as in tests/unit/test_storage_audit.py: a raw sqlite3 connection with
the append-only triggers dropped (its `tamper` fixture).
"""

from __future__ import annotations

import datetime as dt
import sqlite3

from storage import approvals as stored_approvals
from storage import audit
from storage import freezes as stored_freezes
from storage.database import Database
from tests.unit.test_audit_head_and_rows import put_anchor, three_rows
from tests.unit.test_storage_audit import NOW, _pending_request, tamper, write_rows  # noqa: F401 (the fixture)

HOUR = dt.timedelta(hours=1)


def broken(checked: int, first_bad_seq: int | None, problem: str) -> audit.VerifyResult:
    return audit.VerifyResult(ok=False, checked=checked, first_bad_seq=first_bad_seq, problem=problem)


def test_several_rows_deleted_from_the_middle_are_named_as_a_range(db, tamper):  # noqa: F811
    write_rows(db, 6)

    tamper.execute("DELETE FROM audit WHERE seq IN (3, 4)")

    assert audit.verify(db) == broken(2, 3, "audit rows 3-4 are missing (rows jump from 2 to 5)")


def test_one_row_deleted_from_the_end_is_named_alone(db, tamper):  # noqa: F811
    write_rows(db, 3)

    tamper.execute("DELETE FROM audit WHERE seq = 3")

    assert audit.verify(db) == broken(
        2, 3, "audit row 3 is missing from the end (the anchor says the log ends there)")


def test_several_rows_past_the_anchor_are_named_as_a_range_from_the_first_of_them(db):
    first, *_ = three_rows(db)
    put_anchor(db, 1, first.hash)

    assert audit.verify(db) == broken(
        1, 2, "audit rows 2-3 were added without going through gpuops (the anchor says the log ends at row 1)")


def test_a_row_that_no_longer_parses_is_reported_with_the_parsers_error(db, tamper):  # noqa: F811
    write_rows(db, 3)
    tamper.execute("PRAGMA ignore_check_constraints = ON")

    tamper.execute("UPDATE audit SET detail = ? WHERE seq = 2", ('{"broken": tru',))

    assert audit.verify(db) == broken(
        1, 2, "audit row 2 cannot be read, so it was changed after it was written "
              "(JSONDecodeError: Expecting value: line 1 column 12 (char 11))")


def rebuild_without_strict_columns(raw: sqlite3.Connection) -> None:
    """What an intruder with the file can do: the audit table again, its columns untyped."""
    columns = ", ".join(f'"{info[1]}"' for info in raw.execute("PRAGMA table_info(audit)"))
    raw.execute(f"CREATE TABLE audit_rebuilt ({columns})")
    raw.execute("INSERT INTO audit_rebuilt SELECT * FROM audit")
    raw.execute("DROP TABLE audit")
    raw.execute("ALTER TABLE audit_rebuilt RENAME TO audit")


def test_a_row_whose_seq_is_not_a_number_is_broken_after_the_last_good_row_not_a_crash(db, tamper):  # noqa: F811
    write_rows(db, 3)
    rebuild_without_strict_columns(tamper)

    tamper.execute("UPDATE audit SET seq = '3' WHERE seq = 3")

    assert audit.verify(db) == broken(
        2, 3, "the audit row after row 2 has the seq '3', which is not a row number")


def test_a_denial_no_audit_row_mentions_is_reported_as_a_denial_after_the_sound_rows(db):
    request = _pending_request(db)
    audit.append(db, actor="U0ALICE", k8s_identity=None, action="request.created", target="serving-a",
                 request_id=request.id, at=NOW)
    stored_approvals.record(db, request_id=request.id, approver="U0BOB", decision="deny",
                            plan_hash=request.plan_hash, at=NOW)

    assert audit.verify(db) == broken(
        1, None, f"the denial of request {request.id} by U0BOB is stored but no audit row mentions it: "
                 "its rows were wiped")


def test_an_empty_log_beside_two_freezes_counts_them_in_the_plural(db: Database):
    for target in ("serving-a", "training-b"):
        stored_freezes.create(db, target=target, until=NOW + HOUR, reason="incident", let_running_finish=False,
                              set_by="U0ERIN", set_by_name="erin", at=NOW)

    assert audit.verify(db) == broken(
        0, None, "the audit log is empty but the freezes table holds 2 rows: its rows were wiped")
