"""The durable state of gpuops: one SQLite file, reached through sqlite-utils.

What belongs here:

- `database`: opening the file (WAL, foreign keys, busy timeout, synchronous=FULL),
  the `Database` handle, `transaction()`, and the thread model.
- `migrations`: the ordered, versioned schema changes applied at open.
- One repository module per table family, named after the domain word: `requests`,
  `approvals`, `runs`, `steps`, `audit`, `outbox`, `idempotency`, `handovers`, `kv`.
  Each is a handful of typed functions (keyword-only arguments) that return frozen
  dataclasses and report compare-and-set outcomes as booleans.
- `ids` (NewType ids), `codec` (how times and JSON are stored), `errors`.
- `step_params`: a step row's params as typed records (one per step kind, the shared
  ones here, a kind's own beside its step logic) and the one codec between them and the
  stored JSON.

What does not: policy (who may approve, which transitions are legal, when a request
expires) lives in `workflows/`; storage records decisions and makes them atomic, it does
not make them. This package imports nothing from `bot`, `commands` or `workflows`, and
never imports `kubernetes` or Slack libraries.

Conventions, once for the whole package:

- Time is an argument (`at=`, `now=`). Storage reads the clock in one documented place:
  `open_database(now=...)` stamps `schema_migrations.applied_at`.
- Times are stored as UTC ISO-8601 text with microseconds and a `Z`
  (`2025-06-07T12:00:00.000000Z`): fixed width, so text order is time order and
  `WHERE expires_at <= :now` works on the column directly. Repositories take and return
  timezone-aware `datetime`s; a naive datetime is refused.
- JSON columns hold canonical JSON (sorted keys, no insignificant whitespace).
- Ids: what people see and type in Slack is short prefixed text (`req-7f3a2c`,
  `run-9b01de`); internal rows (approvals, steps, outbox, handovers, acks) are integer
  rowids; the audit log is numbered by `seq`.
- An insert that would duplicate a unique key returns None instead of raising; an insert
  that breaks a CHECK or a foreign key raises `sqlite3.IntegrityError`.
"""
