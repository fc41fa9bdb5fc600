"""The durable state of gpuops: a SQLite file (the default) or a PostgreSQL database.

Why two databases: SQLite is embedded and needs nothing (one replica, the demo); a team
that needs the bot to survive the loss of its node runs several replicas on PostgreSQL,
the database it already runs. Both answer through one neutral `Database` and the
repositories write one SQL text (the subset both run alike, see `database`); only the
schema is written per database, because DDL differs too much to share.

What belongs here:

- `database`: the neutral `Database` handle, `open_database(path or URL)`,
  `transaction()` (the write lock taken in the database on both), and the thread model.
- `sqlite_backend` and `postgres_backend`: each database's connection, opening checks
  and error mapping (SQLite: WAL, foreign keys, busy timeout, synchronous=FULL, file
  modes; PostgreSQL: the advisory writer lock, placeholders, the redacted URL).
- `migrations` (SQLite's) and `migrations_pg` (PostgreSQL's): the ordered, versioned
  schema changes applied at open; a new migration comes in both.
- One repository module per table family, named after the domain word: `requests`,
  `approvals`, `runs`, `steps`, `audit`, `outbox`, `idempotency`, `inbox` (Slack
  deliveries acknowledged until answered, and the replicas' heartbeats), `handovers`, `kv`.
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
  that breaks a CHECK, a foreign key or a trigger raises `storage.errors.ConstraintViolated`
  on both databases, with the same words.
"""
