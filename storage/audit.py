"""The audit log: append-only, hash-chained, verifiable.

Each row's `hash` is `sha256(prev_hash + canonical JSON of the row's fields)`, where the
fields are everything but the two hashes (`seq` included, so a row cannot move), and
canonical JSON has sorted keys and no insignificant whitespace (`storage.codec`). The
first row chains from `GENESIS`.

Three defences, each catching what the previous cannot:

1. Triggers refuse UPDATE and DELETE (`audit is append-only`), stopping mistakes.
2. The chain: `verify()` recomputes every hash, so a changed, deleted, inserted or
   reordered row is found even after someone drops the triggers.
3. The anchor: the newest (seq, hash) is kept in `kv` under `audit.head`, written in the
   same transaction as each row, so deleting the newest rows (which leaves a valid
   shorter chain) is found too. `append()` chains from the anchor, not from the table, so
   a truncation cannot be papered over by the next append. The anchor sits in the same
   file as the rows; against someone who can rewrite the whole file, publish `head()`
   somewhere else (the handover post, the logs) and pass it back as `verify(expected=...)`.

Beside those, what the log records must be in it: a request, a decision on one or a run
that no row mentions is a break (its rows were wiped, chain and anchor with them), and
an empty log beside tables only ever written with audit rows is not the genesis of a
new log, so `verify` never passes it as one.

Appends are serialised by the write lock (`BEGIN IMMEDIATE`), so concurrent writers
cannot fork the chain.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from storage import codec, kv
from storage.codec import JsonInput, JsonValue
from storage.database import Database
from storage.ids import AuditSeq, RequestId, RunId

GENESIS = "0" * 64
ANCHOR_KEY = "audit.head"
GPUOPS_ACTOR = "gpuops"

_HASHED_FIELDS = (
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
)
_JSON_FIELDS = ("before", "after", "detail")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: AuditSeq
    at: dt.datetime
    actor: str
    k8s_identity: str | None
    action: str
    target: str
    request_id: RequestId | None
    run_id: RunId | None
    before: JsonValue
    after: JsonValue
    detail: JsonValue
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class AuditHead:
    """The newest row's position and hash; `seq` 0 and `GENESIS` for an empty log."""

    seq: int
    hash: str

    @property
    def text(self) -> str:
        """How the head is published: `SEQ:HASH` (`parse_head` reads it back)."""
        return f"{self.seq}:{self.hash}"


_HEAD_TEXT = re.compile(r"(\d{1,18}):([0-9a-f]{64})", re.ASCII)


class BadHead(ValueError):
    """A published head that is not `SEQ:HASH`; the message says what was wrong."""


def parse_head(text: str) -> AuditHead:
    """`SEQ:HASH` as gpuops publishes it (e.g. in a handover post) back into a head."""
    found = _HEAD_TEXT.fullmatch(text.strip().lower())
    if found is None:
        raise BadHead(
            f"{text!r} is not an audit head: it is SEQ:HASH as gpuops publishes it, the entry "
            "number, a colon and the 64 hex digits of that entry's hash (e.g. 42:3f9a…)"
        )
    return AuditHead(seq=int(found.group(1)), hash=found.group(2))


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    first_bad_seq: int | None
    problem: str | None


def append(
    db: Database,
    *,
    actor: str,
    k8s_identity: str | None,
    action: str,
    target: str,
    at: dt.datetime,
    request_id: RequestId | None = None,
    run_id: RunId | None = None,
    before: JsonInput = None,
    after: JsonInput = None,
    detail: JsonInput = None,
) -> AuditEntry:
    """Add one row at the end of the chain. `actor` is a Slack user id or `"gpuops"`;
    `k8s_identity` the Kubernetes user the change was made as, if it touched the cluster.
    Call it inside the transaction that makes the change it records."""
    with db.transaction():
        head = head_of(db)
        fields: dict[str, Any] = {
            "seq": head.seq + 1,
            "at": codec.time_to_text(at),
            "actor": actor,
            "k8s_identity": k8s_identity,
            "action": action,
            "target": target,
            "request_id": request_id,
            "run_id": run_id,
            "before": before,
            "after": after,
            "detail": detail,
        }
        digest = _chain_hash(head.hash, fields)
        row = {
            **fields,
            **{name: codec.optional_json_to_text(fields[name]) for name in _JSON_FIELDS},
            "prev_hash": head.hash,
            "hash": digest,
        }
        db.insert("audit", row)
        kv.put(db, key=ANCHOR_KEY, value=codec.json_to_text({"seq": row["seq"], "hash": digest}))
    return _from_row(row)


def head_of(db: Database) -> AuditHead:
    """Where the next row chains from: the anchor, else the last row, else genesis."""
    anchor = _anchor(db)
    if anchor is not None:
        return anchor
    row = db.query_one("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
    return AuditHead(seq=0, hash=GENESIS) if row is None else AuditHead(row["seq"], row["hash"])


def verify(db: Database, *, expected: AuditHead | None = None) -> VerifyResult:
    """Walk the whole chain; stop at the first problem.

    `expected` is a head published elsewhere earlier: its row must still be in the chain
    with that hash. `checked` counts rows found sound before the problem (all rows if ok).
    """
    previous = AuditHead(seq=0, hash=GENESIS)
    checked = 0
    expected_seen = expected is None or expected.seq == 0
    for row in _rows_in_order(db):
        seq = row["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool):
            return _bad(checked, previous.seq + 1, _unreadable_seq(previous.seq, seq))
        if seq != previous.seq + 1:
            return _bad(checked, previous.seq + 1, _missing_rows(previous.seq, seq))
        if row["prev_hash"] != previous.hash:
            return _bad(checked, seq, _broken_link(seq))
        try:
            digest = _chain_hash(previous.hash, _hashed_fields(row))
        except (ValueError, TypeError, RecursionError) as err:  # garbage JSON, 1e400, NaN
            return _bad(checked, seq, _unreadable_row(seq, err))
        if digest != row["hash"]:
            return _bad(checked, seq, _changed_row(seq))
        if expected is not None and seq == expected.seq:
            if row["hash"] != expected.hash:
                return _bad(checked, seq, _differs_from_published(seq))
            expected_seen = True
        previous = AuditHead(seq=seq, hash=row["hash"])
        checked += 1

    if not expected_seen:
        assert expected is not None
        return _bad(checked, previous.seq + 1, _published_row_missing(expected.seq, previous.seq))
    try:
        anchor = _anchor(db)
    except _UnreadableAnchor as err:
        return _bad(checked, previous.seq or None, _anchor_unreadable(str(err)))
    if anchor is None:
        if checked:
            return _bad(checked, None, _anchor_missing(previous.seq))
    elif anchor.seq > previous.seq:
        return _bad(checked, previous.seq + 1, _tail_missing(previous.seq, anchor.seq))
    elif anchor.seq == previous.seq and anchor.hash != previous.hash:
        return _bad(checked - 1, previous.seq, _last_row_not_anchored(previous.seq))
    elif anchor.seq < previous.seq:
        return _bad(anchor.seq, anchor.seq + 1, _rows_after_anchor(anchor.seq, previous.seq))
    unaudited = _unaudited(db)
    if unaudited is not None:
        return _bad(checked, None, unaudited)
    return VerifyResult(ok=True, checked=checked, first_bad_seq=None, problem=None)


# Tables whose every row is written with an audit row: an empty log beside any of them
# was wiped (it is never the genesis of a log that has not started yet).
_AUDITED_TABLES = ("requests", "approvals", "runs", "steps", "freezes", "handovers", "handover_acks",
                  "node_notes")


def _unaudited(db: Database) -> str | None:
    """A request, a decision on one or a run that no audit row mentions, if there is one;
    else, with no audit row at all, a table that was written with audit rows."""
    request = db.query_one(
        "SELECT id, state FROM requests WHERE NOT EXISTS "
        "(SELECT 1 FROM audit WHERE audit.request_id = requests.id) ORDER BY created_at LIMIT 1")
    if request is not None:
        return _unaudited_row("request", request["id"], request["state"])
    decision = db.query_one(
        "SELECT request_id, approver, decision FROM approvals WHERE NOT EXISTS "
        "(SELECT 1 FROM audit WHERE audit.request_id = approvals.request_id AND audit.actor = approvals.approver) "
        "ORDER BY created_at LIMIT 1")
    if decision is not None:
        return _unaudited_decision(decision["request_id"], decision["approver"], decision["decision"])
    run = db.query_one(
        "SELECT id, state FROM runs WHERE NOT EXISTS "
        "(SELECT 1 FROM audit WHERE audit.run_id = runs.id) ORDER BY created_at LIMIT 1")
    if run is not None:
        return _unaudited_row("run", run["id"], run["state"])
    if db.query_one("SELECT 1 FROM audit LIMIT 1") is None:
        for table in _AUDITED_TABLES:
            found = db.query_one(f"SELECT count(*) AS n FROM {table}")  # noqa: S608 - names from the tuple above
            if found is not None and found["n"]:
                return _empty_log_beside(table, found["n"])
    return None


def export_jsonl(db: Database, stream: TextIO) -> int:
    """Write every row, oldest first, as one canonical JSON object per line (JSON columns
    as nested values, hashes included, so the chain can be re-verified offline).
    Returns the number of rows written."""
    count = 0
    for row in _rows_in_order(db):
        stream.write(
            codec.json_to_text(
                {**_hashed_fields(row), "prev_hash": row["prev_hash"], "hash": row["hash"]}
            )
        )
        stream.write("\n")
        count += 1
    return count


def recent(db: Database, n: int) -> list[AuditEntry]:
    """The newest `n` rows, newest first."""
    rows = db.query("SELECT * FROM audit ORDER BY seq DESC LIMIT ?", (n,))
    return [_from_row(r) for r in rows]


def for_request(db: Database, request_id: RequestId) -> list[AuditEntry]:
    """Everything recorded about one request, oldest first."""
    rows = db.query("SELECT * FROM audit WHERE request_id = ? ORDER BY seq", (request_id,))
    return [_from_row(r) for r in rows]


def for_run(db: Database, run_id: RunId, *, actions: Sequence[str] | None = None) -> list[AuditEntry]:
    """Everything recorded about one run, oldest first; with `actions`, only those (read
    by the index, not decoded row by row: the engine asks on its passes)."""
    if actions is None:
        rows = db.query("SELECT * FROM audit WHERE run_id = ? ORDER BY seq", (run_id,))
    else:
        marks = ", ".join("?" for _ in actions)
        rows = db.query(f"SELECT * FROM audit WHERE run_id = ? AND action IN ({marks}) ORDER BY seq",
                        (run_id, *actions))
    return [_from_row(r) for r in rows]


# ------------------------------------------------------------------ the chain


def _chain_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    return hashlib.sha256((prev_hash + codec.json_to_text(fields)).encode("utf-8")).hexdigest()


def _hashed_fields(row: dict[str, Any]) -> dict[str, Any]:
    fields = {name: row[name] for name in _HASHED_FIELDS}
    for name in _JSON_FIELDS:
        fields[name] = codec.optional_json_from_text(fields[name])
    return fields


def _rows_in_order(db: Database) -> Iterator[dict[str, Any]]:
    # Streamed, not fetched at once: the audit log grows without bound.
    cursor = db.execute("SELECT * FROM audit ORDER BY seq")
    names = [d[0] for d in cursor.description]
    for values in cursor:
        yield dict(zip(names, values))


class _UnreadableAnchor(ValueError):
    pass


def _anchor(db: Database) -> AuditHead | None:
    text = kv.get(db, key=ANCHOR_KEY)
    if text is None:
        return None
    try:
        value = json.loads(text)
        seq, digest = value["seq"], value["hash"]
    except (ValueError, TypeError, KeyError) as err:
        raise _UnreadableAnchor(f"{type(err).__name__}: {err}") from None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(digest, str):
        raise _UnreadableAnchor(f"it holds seq {seq!r} and hash {digest!r}")
    return AuditHead(seq=seq, hash=digest)


def _from_row(row: dict[str, Any]) -> AuditEntry:
    return AuditEntry(
        seq=AuditSeq(row["seq"]),
        at=codec.time_from_text(row["at"]),
        actor=row["actor"],
        k8s_identity=row["k8s_identity"],
        action=row["action"],
        target=row["target"],
        request_id=None if row["request_id"] is None else RequestId(row["request_id"]),
        run_id=None if row["run_id"] is None else RunId(row["run_id"]),
        before=codec.optional_json_from_text(row["before"]),
        after=codec.optional_json_from_text(row["after"]),
        detail=codec.optional_json_from_text(row["detail"]),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


# ------------------------------------------------------------------ problem wording


def _bad(checked: int, first_bad_seq: int | None, problem: str) -> VerifyResult:
    return VerifyResult(ok=False, checked=checked, first_bad_seq=first_bad_seq, problem=problem)


def _missing_rows(last_good: int, next_found: int) -> str:
    if next_found == last_good + 2:
        return f"audit row {last_good + 1} is missing (rows jump from {last_good} to {next_found})"
    return (
        f"audit rows {last_good + 1}-{next_found - 1} are missing "
        f"(rows jump from {last_good} to {next_found})"
    )


def _broken_link(seq: int) -> str:
    return (
        f"audit row {seq} does not chain from row {seq - 1}: rows were deleted, inserted "
        "or reordered"
    )


def _unreadable_seq(last_good: int, found: object) -> str:
    return f"the audit row after row {last_good} has the seq {found!r}, which is not a row number"


def _unreadable_row(seq: int, err: Exception) -> str:
    return f"audit row {seq} cannot be read, so it was changed after it was written ({type(err).__name__}: {err})"


def _anchor_unreadable(why: str) -> str:
    return f"the audit anchor ({ANCHOR_KEY}) cannot be read, so it was changed ({why})"


def _unaudited_row(what: str, id: str, state: str) -> str:
    return f"{what} {id} is {state} but no audit row mentions it: its rows were wiped"


def _unaudited_decision(request_id: str, approver: str, decision: str) -> str:
    verb = "approval" if decision == "approve" else "denial"
    return f"the {verb} of request {request_id} by {approver} is stored but no audit row mentions it: its rows were wiped"


def _empty_log_beside(table: str, rows: int) -> str:
    return f"the audit log is empty but the {table} table holds {rows} row{'s' if rows != 1 else ''}: its rows were wiped"


def _changed_row(seq: int) -> str:
    return f"audit row {seq} was changed after it was written (its hash no longer matches)"


def _differs_from_published(seq: int) -> str:
    return f"audit row {seq} does not match the head published earlier"


def _published_row_missing(published: int, last: int) -> str:
    return f"the head published earlier is row {published}, but the log ends at row {last}"


def _anchor_missing(last: int) -> str:
    return f"the audit anchor ({ANCHOR_KEY}) is missing although the log has {last} rows"


def _tail_missing(last: int, anchored: int) -> str:
    if anchored == last + 1:
        return f"audit row {anchored} is missing from the end (the anchor says the log ends there)"
    return (
        f"audit rows {last + 1}-{anchored} are missing from the end "
        "(the anchor says the log ends there)"
    )


def _last_row_not_anchored(last: int) -> str:
    return f"the last audit row {last} does not match the anchor: it was rewritten"


def _rows_after_anchor(anchored: int, last: int) -> str:
    rows = f"row {last} was" if last == anchored + 1 else f"rows {anchored + 1}-{last} were"
    return (
        f"audit {rows} added without going through gpuops "
        f"(the anchor says the log ends at row {anchored})"
    )
