"""Versioned schema changes, applied in order when the database is opened.

A migration is `(version, description, apply)` where `apply` is SQL (run statement by
statement) or a function taking the `sqlite_utils.Database`. Versions are 1, 2, 3, ...
Released migrations never change: a new column or table is a new migration.

The applied version lives in `PRAGMA user_version` (read before anything is written, so
a too-new file can be refused untouched) and every applied migration is recorded in
`schema_migrations(version, description, applied_at)`. `PRAGMA application_id` marks
the file as gpuops's, so gpuops refuses to add tables to some other program's database.

Each migration runs in its own `BEGIN IMMEDIATE` transaction together with the version
bump and its `schema_migrations` row, so a migration that fails leaves the database at
the previous version with none of its changes. Holding the write lock also makes two
processes (or threads) opening the same file at once apply each migration exactly once:
the version is read again under the lock. `PRAGMA foreign_keys` cannot change inside a
transaction, so a migration that rebuilds a referenced table must keep keys consistent
itself; `PRAGMA foreign_key_check` runs before each commit and fails the migration if not.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from storage import codec
from storage.errors import MigrationFailed, MigrationsOutOfOrder, SchemaTooNew, StorageError

# "gpuo" in ASCII; identifies the file as a gpuops database (`PRAGMA application_id`).
APPLICATION_ID = 0x6770756F


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    apply: str | Callable[[sqlite_utils.Database], None]
    # Rebuilds a table others reference: run with foreign keys off (SQLite's own procedure
    # for schema changes ALTER TABLE cannot make); foreign_key_check still runs before commit.
    rebuilds_referenced: bool = False


SCHEMA_V1 = """
-- Requests: a drain window, driver upgrade or MIG change, bound to a plan by its hash.
CREATE TABLE requests (
    id                 TEXT PRIMARY KEY,
    kind               TEXT NOT NULL CHECK (kind IN ('drain', 'upgrade', 'mig')),
    pool               TEXT NOT NULL,
    targets            TEXT NOT NULL CHECK (json_valid(targets)),
    window_start       TEXT,
    window_end         TEXT,
    reason             TEXT NOT NULL,
    requester          TEXT NOT NULL,
    requester_name     TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied',
                           'cancelled', 'expired', 'scheduled', 'running', 'done', 'failed',
                           'missed')),
    plan               TEXT NOT NULL CHECK (json_valid(plan)),
    plan_hash          TEXT NOT NULL,
    approvals_required INTEGER NOT NULL CHECK (approvals_required >= 0),
    expires_at         TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    channel            TEXT,
    thread_ts          TEXT,
    CHECK (window_end IS NULL OR window_start IS NULL OR window_end > window_start)
) STRICT;
CREATE INDEX requests_by_state ON requests (state, expires_at);
CREATE INDEX requests_by_pool ON requests (pool, created_at);

-- One row per approver decision on one plan hash; a new plan needs new decisions.
CREATE TABLE approvals (
    id         INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL REFERENCES requests (id),
    approver   TEXT NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ('approve', 'deny')),
    plan_hash  TEXT NOT NULL,
    reason     TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (request_id, approver, plan_hash)
) STRICT;

-- A durable execution of a request's plan. At most one unfinished run per request.
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    request_id    TEXT NOT NULL REFERENCES requests (id),
    state         TEXT NOT NULL CHECK (state IN ('pending', 'running', 'paused', 'aborted',
                      'failed', 'succeeded')),
    dry_run       INTEGER NOT NULL CHECK (dry_run IN (0, 1)),
    current_wave  INTEGER,
    created_at    TEXT NOT NULL,
    started_at    TEXT,
    ended_at      TEXT,
    halted_reason TEXT
) STRICT;
CREATE UNIQUE INDEX runs_one_unfinished_per_request ON runs (request_id)
    WHERE state IN ('pending', 'running', 'paused');
CREATE INDEX runs_by_state ON runs (state);

CREATE TABLE steps (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    wave       INTEGER NOT NULL CHECK (wave >= 0),
    node       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('cordon', 'wait-for-jobs', 'evict', 'drain',
                   'driver', 'mig', 'wait-for', 'validate', 'uncordon', 'hold')),
    state      TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed',
                   'skipped')),
    attempt    INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    started_at TEXT,
    ended_at   TEXT,
    detail     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail)),
    error      TEXT,
    UNIQUE (run_id, node, seq)
) STRICT;
CREATE INDEX steps_in_order ON steps (run_id, wave, node, seq);

-- Append-only and hash-chained; see storage/audit.py. No foreign keys on purpose: the
-- audit must accept a row about anything, and must never block the change it records.
CREATE TABLE audit (
    seq          INTEGER PRIMARY KEY,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    k8s_identity TEXT,
    action       TEXT NOT NULL,
    target       TEXT NOT NULL,
    request_id   TEXT,
    run_id       TEXT,
    "before"     TEXT CHECK ("before" IS NULL OR json_valid("before")),
    "after"      TEXT CHECK ("after" IS NULL OR json_valid("after")),
    detail       TEXT CHECK (detail IS NULL OR json_valid(detail)),
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL
) STRICT;
CREATE INDEX audit_by_request ON audit (request_id) WHERE request_id IS NOT NULL;
CREATE INDEX audit_by_run ON audit (run_id) WHERE run_id IS NOT NULL;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only');
END;

-- Slack messages to deliver, written in the same transaction as the change they report.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY,
    created_at      TEXT NOT NULL,
    channel         TEXT NOT NULL,
    thread_ts       TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('post', 'update', 'ephemeral', 'dm')),
    payload         TEXT NOT NULL CHECK (json_valid(payload)),
    dedupe_key      TEXT UNIQUE,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent',
                        'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TEXT NOT NULL,
    claimed_until   TEXT,
    sent_at         TEXT,
    message_ts      TEXT
) STRICT;
CREATE INDEX outbox_due ON outbox (state, next_attempt_at, id);
CREATE INDEX outbox_by_thread ON outbox (channel, thread_ts, id) WHERE state = 'pending';

-- Keys already seen (Slack retries, Socket Mode envelopes, button clicks), per scope.
CREATE TABLE idempotency (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    created_at TEXT NOT NULL,
    result     TEXT CHECK (result IS NULL OR json_valid(result)),
    PRIMARY KEY (scope, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX idempotency_by_age ON idempotency (created_at);

-- Shift-change handover checklists and who acknowledged them.
CREATE TABLE handovers (
    id          INTEGER PRIMARY KEY,
    rotation    TEXT NOT NULL,
    shift_start TEXT NOT NULL,
    posted_at   TEXT,
    channel     TEXT NOT NULL,
    ts          TEXT,
    content     TEXT NOT NULL CHECK (json_valid(content)),
    late        INTEGER NOT NULL DEFAULT 0 CHECK (late IN (0, 1)),
    acked_by    TEXT,
    acked_at    TEXT,
    UNIQUE (rotation, shift_start)
) STRICT;
CREATE TABLE handover_acks (
    id          INTEGER PRIMARY KEY,
    handover_id INTEGER NOT NULL REFERENCES handovers (id),
    user        TEXT NOT NULL,
    at          TEXT NOT NULL,
    counted     INTEGER NOT NULL CHECK (counted IN (0, 1))
) STRICT;
CREATE INDEX handover_acks_by_handover ON handover_acks (handover_id, at);

-- Small named values: the audit chain's anchor, the engine's lease holder notes.
CREATE TABLE kv (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
"""

# The two-person rule in the schema too (workflows/requests/policy.py enforces it first): no
# decision row, approve or deny, from the request's own requester. Rows a database
# already holds stay as they are (policy never counted them); new ones are refused.
NO_SELF_APPROVAL = """
CREATE TRIGGER approvals_not_by_the_requester BEFORE INSERT ON approvals
WHEN NEW.approver = (SELECT requester FROM requests WHERE id = NEW.request_id)
BEGIN
    SELECT RAISE(ABORT, 'a request''s requester cannot decide on it (two-person rule)');
END;
CREATE TRIGGER approvals_not_moved_to_the_requester BEFORE UPDATE OF approver, request_id ON approvals
WHEN NEW.approver = (SELECT requester FROM requests WHERE id = NEW.request_id)
BEGIN
    SELECT RAISE(ABORT, 'a request''s requester cannot decide on it (two-person rule)');
END;
"""

# SQLite cannot change a CHECK constraint: the steps table is rebuilt with the wider one
# (nothing references it), rows and ids kept.
def _steps_with_kinds(kinds: Sequence[str], *, version: int) -> str:
    listed = ", ".join(f"'{kind}'" for kind in kinds)
    return f"""
CREATE TABLE steps_v{version} (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    wave       INTEGER NOT NULL CHECK (wave >= 0),
    node       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ({listed})),
    state      TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed',
                   'skipped')),
    attempt    INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    started_at TEXT,
    ended_at   TEXT,
    detail     TEXT NOT NULL DEFAULT '{{}}' CHECK (json_valid(detail)),
    error      TEXT,
    UNIQUE (run_id, node, seq)
) STRICT;
INSERT INTO steps_v{version} (id, run_id, wave, node, seq, kind, state, attempt, started_at, ended_at, detail, error)
    SELECT id, run_id, wave, node, seq, kind, state, attempt, started_at, ended_at, detail, error FROM steps;
DROP TABLE steps;
ALTER TABLE steps_v{version} RENAME TO steps;
CREATE INDEX steps_in_order ON steps (run_id, wave, node, seq);
"""


_V1_STEP_KINDS = ("cordon", "wait-for-jobs", "evict", "drain", "driver", "mig", "wait-for", "validate", "uncordon",
                  "hold")
DRIVER_VERSION_STEP = _steps_with_kinds((*_V1_STEP_KINDS, "driver-version"), version=3)
# Gating the operator's own upgrade (autoUpgrade on): hold nodes back, follow one node.
OPERATOR_UPGRADE_STEPS = _steps_with_kinds((*_V1_STEP_KINDS, "driver-version", "operator-hold", "operator-upgrade"),
                                           version=4)
# The upgrade's canary pod on each node before it is given back.
GPU_CHECK_STEP = _steps_with_kinds((*_V1_STEP_KINDS, "driver-version", "operator-hold", "operator-upgrade",
                                    "gpu-check"), version=5)

# Host-driver migration: requests of kind migrate; steps that snapshot a node, wait for a
# person to remove (or install) its host driver, set its labels, and restore the snapshot.
_MIGRATE_STEP_KINDS = ("snapshot", "host-driver-removed", "host-driver-installed", "node-labels", "restore")
MIGRATE_KIND = f"""
{SCHEMA_V1[SCHEMA_V1.index("CREATE TABLE requests ("):SCHEMA_V1.index("CREATE INDEX requests_by_state")]
 .replace("CREATE TABLE requests (", "CREATE TABLE requests_v6 (")
 .replace("CHECK (kind IN ('drain', 'upgrade', 'mig'))", "CHECK (kind IN ('drain', 'upgrade', 'mig', 'migrate'))")}
INSERT INTO requests_v6 SELECT * FROM requests;
DROP TABLE requests;
PRAGMA legacy_alter_table = ON;
ALTER TABLE requests_v6 RENAME TO requests;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX requests_by_state ON requests (state, expires_at);
CREATE INDEX requests_by_pool ON requests (pool, created_at);
""" + _steps_with_kinds((*_V1_STEP_KINDS, "driver-version", "operator-hold", "operator-upgrade", "gpu-check",
                         *_MIGRATE_STEP_KINDS), version=6)

# Change freezes (storage/freezes.py): in force while until > now and not lifted; no job
# ends them. `replaced_by` names the freeze that took over the target.
FREEZES = """
CREATE TABLE freezes (
    id                 INTEGER PRIMARY KEY,
    target             TEXT NOT NULL CHECK (length(target) > 0),
    until              TEXT NOT NULL,
    reason             TEXT NOT NULL,
    let_running_finish INTEGER NOT NULL CHECK (let_running_finish IN (0, 1)),
    set_by             TEXT NOT NULL,
    set_by_name        TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    lifted_at          TEXT,
    lifted_by          TEXT,
    lifted_by_name     TEXT,
    lift_reason        TEXT,
    replaced_by        INTEGER REFERENCES freezes (id),
    CHECK (until > created_at),
    CHECK ((lifted_at IS NULL) = (lifted_by IS NULL))
) STRICT;
CREATE INDEX freezes_in_force ON freezes (target, until) WHERE lifted_at IS NULL;
"""

REQUEST_AND_FREEZE_CLUSTER = """
ALTER TABLE requests ADD COLUMN cluster TEXT CHECK (cluster IS NULL OR length(cluster) > 0);
ALTER TABLE freezes ADD COLUMN cluster TEXT CHECK (cluster IS NULL OR length(cluster) > 0);
CREATE INDEX freezes_by_cluster ON freezes (cluster, target) WHERE lifted_at IS NULL;
"""

# What an unfinished run waits for before its next node or wave (a change freeze, the
# pool's capacity or window), one sentence the engine keeps current; NULL: nothing. A
# step's own wait (a PodDisruptionBudget, a person) is in the step's detail.
RUN_WAITING = """
ALTER TABLE runs ADD COLUMN waiting TEXT;
"""

# A running drain's pending extension (storage/requests.py `PendingExtension`): the later
# window end with the plan that carries it, waiting for the pool's approvals on its hash
# until `extension_expires_at`; all NULL when none is asked for.
EXTENSION_COLUMNS = """
ALTER TABLE requests ADD COLUMN extension_window_end TEXT;
ALTER TABLE requests ADD COLUMN extension_plan TEXT CHECK (extension_plan IS NULL OR json_valid(extension_plan));
ALTER TABLE requests ADD COLUMN extension_plan_hash TEXT;
ALTER TABLE requests ADD COLUMN extension_asked_by TEXT;
ALTER TABLE requests ADD COLUMN extension_asked_at TEXT;
ALTER TABLE requests ADD COLUMN extension_expires_at TEXT;
CREATE INDEX requests_extension_due ON requests (extension_expires_at) WHERE extension_plan_hash IS NOT NULL;
"""

# Kinds as reference rows instead of CHECK lists, so a new kind of request or step is a row
# the opener writes (`register_kinds`), not a rebuilt table. This is the last rebuild of
# `requests` and `steps` for a kind: each is copied under its own schema text with the
# kind's CHECK list swapped for a foreign key, rows, ids and indexes kept, and the reference
# tables start with exactly the kinds the CHECK lists allowed (read from the schema itself).
_KIND_CHECK = re.compile(r"CHECK\s*\(\s*kind\s+IN\s*\(([^)]*)\)\s*\)", re.IGNORECASE)


def _kinds_by_reference(db: sqlite_utils.Database) -> None:
    conn = db.conn
    conn.execute("CREATE TABLE request_kinds (name TEXT PRIMARY KEY CHECK (length(name) > 0)) STRICT, WITHOUT ROWID")
    conn.execute("CREATE TABLE step_kinds (name TEXT PRIMARY KEY CHECK (length(name) > 0)) STRICT, WITHOUT ROWID")
    for table, reference in (("requests", "request_kinds"), ("steps", "step_kinds")):
        schema = conn.execute("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?", [table]).fetchone()[0]
        found = _KIND_CHECK.search(schema)
        if found is None:
            raise StorageError(f"the {table} table has no CHECK list of kinds to replace")
        kinds = [k.strip().strip("'") for k in found.group(1).split(",")]
        conn.executemany(f"INSERT INTO {reference} (name) VALUES (?)", [(k,) for k in kinds])
        indexes = [row[0] for row in conn.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", [table])]
        rebuilt = (schema[:found.start()] + f"REFERENCES {reference} (name)" + schema[found.end():])
        rebuilt = re.sub(rf"^CREATE TABLE \"?{table}\"?", f"CREATE TABLE {table}_v11", rebuilt)
        conn.execute(rebuilt)
        conn.execute(f"INSERT INTO {table}_v11 SELECT * FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        # NB: legacy renaming leaves the references other tables (approvals, runs) and the
        # two-person triggers make to `requests` as they are: they name it, not its copy.
        conn.execute("PRAGMA legacy_alter_table = ON")
        conn.execute(f"ALTER TABLE {table}_v11 RENAME TO {table}")
        conn.execute("PRAGMA legacy_alter_table = OFF")
        for index in indexes:
            conn.execute(index)
    conn.execute("CREATE INDEX steps_by_kind ON steps (kind)")
    conn.execute("CREATE INDEX requests_by_kind ON requests (kind)")


def register_kinds(db: sqlite_utils.Database, *, request_kinds: Sequence[str], step_kinds: Sequence[str]) -> None:
    """Make sure the reference rows of these kinds exist (the caller's registry of kinds);
    writes only when one is missing. Rows are never removed: stored requests and steps may
    name a kind no code registers any more. Before migration 11 there is nothing to write:
    the CHECK lists then decide."""
    conn = db.conn
    if schema_version(conn) < KINDS_BY_REFERENCE:
        return
    known_requests = {row[0] for row in conn.execute("SELECT name FROM request_kinds")}
    known_steps = {row[0] for row in conn.execute("SELECT name FROM step_kinds")}
    missing_requests = [k for k in dict.fromkeys(request_kinds) if k not in known_requests]
    missing_steps = [k for k in dict.fromkeys(step_kinds) if k not in known_steps]
    if not missing_requests and not missing_steps:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("INSERT OR IGNORE INTO request_kinds (name) VALUES (?)", [(k,) for k in missing_requests])
        conn.executemany("INSERT OR IGNORE INTO step_kinds (name) VALUES (?)", [(k,) for k in missing_steps])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


KINDS_BY_REFERENCE = 11

# Notes on nodes (storage/notes.py): why a node is cordoned or tainted, from an operator,
# in force while until > now. Rows are never deleted: they are the history.
NODE_NOTES = """
CREATE TABLE node_notes (
    id           INTEGER PRIMARY KEY,
    node         TEXT NOT NULL CHECK (length(node) > 0),
    cluster      TEXT CHECK (cluster IS NULL OR length(cluster) > 0),
    text         TEXT NOT NULL CHECK (length(text) > 0),
    until        TEXT NOT NULL,
    set_by       TEXT NOT NULL,
    set_by_name  TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    CHECK (until > created_at)
) STRICT;
CREATE INDEX node_notes_in_force ON node_notes (cluster, node, until);
"""

CAPACITY_SAMPLES = """
CREATE TABLE capacity_samples (
    cluster     TEXT NOT NULL,
    pool        TEXT NOT NULL CHECK (length(pool) > 0),
    at          TEXT NOT NULL,
    advertised  INTEGER NOT NULL CHECK (advertised >= 0),
    out         INTEGER NOT NULL CHECK (out >= 0),
    PRIMARY KEY (cluster, pool, at)
) STRICT;
CREATE INDEX capacity_samples_by_time ON capacity_samples (at);
"""

# Kubernetes Events waiting to be sent (storage/kube_events.py), queued in the transaction
# that audits the action they report and sent by the Lease holder's event sender. One row
# per Event (`key`: the run, the object and the reason): a repeat bumps `count`, which the
# sender turns into the Event's series. Sent rows are pruned; nothing here is history.
KUBE_EVENTS = """
CREATE TABLE kube_events (
    id               INTEGER PRIMARY KEY,
    key              TEXT NOT NULL UNIQUE CHECK (length(key) > 0),
    cluster          TEXT CHECK (cluster IS NULL OR length(cluster) > 0),
    namespace        TEXT NOT NULL CHECK (length(namespace) > 0),
    name             TEXT NOT NULL CHECK (length(name) > 0),
    body             TEXT NOT NULL CHECK (json_valid(body)),
    first_at         TEXT NOT NULL,
    last_at          TEXT NOT NULL,
    count            INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1),
    sent_count       INTEGER NOT NULL DEFAULT 0 CHECK (sent_count >= 0),
    next_attempt_at  TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    given_up         INTEGER NOT NULL DEFAULT 0 CHECK (given_up IN (0, 1))
) STRICT;
CREATE INDEX kube_events_due ON kube_events (next_attempt_at) WHERE given_up = 0 AND sent_count < count;
"""

INBOX_AND_HEARTBEATS = """
-- Deliveries from Slack this installation acknowledged: written before the ack, so a
-- replica that dies before answering leaves them for a survivor (storage.inbox).
CREATE TABLE inbox (
    key          TEXT PRIMARY KEY CHECK (length(key) > 0),
    kind         TEXT NOT NULL CHECK (length(kind) > 0),
    payload      TEXT NOT NULL CHECK (json_valid(payload)),
    claimed_by   TEXT NOT NULL CHECK (length(claimed_by) > 0),
    received_at  TEXT NOT NULL,
    claimed_at   TEXT NOT NULL,
    takeovers    INTEGER NOT NULL DEFAULT 0 CHECK (takeovers >= 0),
    state        TEXT NOT NULL DEFAULT 'claimed' CHECK (state IN ('claimed', 'answered', 'abandoned')),
    ended_at     TEXT,
    CHECK ((state = 'claimed') = (ended_at IS NULL))
) STRICT, WITHOUT ROWID;
CREATE INDEX inbox_open ON inbox (claimed_by) WHERE state = 'claimed';
CREATE INDEX inbox_by_age ON inbox (received_at);

-- Each replica's heartbeat (its name carries a token of the process, so a restart under the
-- same pod name is a new replica and leaves the old one's deliveries to be taken over).
CREATE TABLE replica_heartbeats (
    name        TEXT PRIMARY KEY CHECK (length(name) > 0),
    started_at  TEXT NOT NULL,
    seen_at     TEXT NOT NULL
) STRICT, WITHOUT ROWID;

-- The delivery that filed a request, set a freeze or wrote a note: run again after its
-- replica died, it answers with what it did instead of doing it again.
ALTER TABLE requests ADD COLUMN delivery TEXT CHECK (delivery IS NULL OR length(delivery) > 0);
CREATE UNIQUE INDEX requests_by_delivery ON requests (delivery);
ALTER TABLE freezes ADD COLUMN delivery TEXT CHECK (delivery IS NULL OR length(delivery) > 0);
CREATE UNIQUE INDEX freezes_by_delivery ON freezes (delivery);
ALTER TABLE node_notes ADD COLUMN delivery TEXT CHECK (delivery IS NULL OR length(delivery) > 0);
CREATE UNIQUE INDEX node_notes_by_delivery ON node_notes (delivery);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "requests, approvals, runs, steps, audit, outbox, idempotency, handovers, kv",
        SCHEMA_V1,
    ),
    Migration(2, "approvals refuse a decision by the request's requester", NO_SELF_APPROVAL),
    Migration(3, "steps may set a driver version (driver-version)", DRIVER_VERSION_STEP),
    Migration(4, "steps may gate the operator's own driver upgrade (operator-hold, operator-upgrade)",
              OPERATOR_UPGRADE_STEPS),
    Migration(5, "steps may run a canary pod on the node (gpu-check)", GPU_CHECK_STEP),
    Migration(6, "requests may move nodes from host drivers to the operator (migrate) with its steps", MIGRATE_KIND,
              rebuilds_referenced=True),
    Migration(7, "change freezes of a pool or the cluster (freezes)", FREEZES),
    Migration(8, "requests and freezes say which cluster they are about (cluster), with several clusters",
              REQUEST_AND_FREEZE_CLUSTER),
    Migration(9, "runs say what they wait for before their next node or wave (waiting)", RUN_WAITING),
    Migration(10, "a running drain may wait for approval of a later window end (extension_*)", EXTENSION_COLUMNS),
    Migration(KINDS_BY_REFERENCE, "request and step kinds are reference rows (request_kinds, step_kinds), "
              "not CHECK lists", _kinds_by_reference, rebuilds_referenced=True),
    Migration(12, "notes on nodes: why a node is cordoned or tainted, until when (node_notes)", NODE_NOTES),
    Migration(13, "each pool's GPUs advertised and out, sampled for its capacity chart (capacity_samples)",
              CAPACITY_SAMPLES),
    Migration(14, "Kubernetes Events waiting to be sent, as series (kube_events)", KUBE_EVENTS),
    Migration(15, "acknowledged Slack deliveries until answered (inbox), replicas' heartbeats "
              "(replica_heartbeats), the delivery that filed a request, set a freeze or wrote a note (delivery)",
              INBOX_AND_HEARTBEATS),
)

_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TEXT NOT NULL
) STRICT
"""


def latest_version(migrations: Sequence[Migration] = MIGRATIONS) -> int:
    return migrations[-1].version if migrations else 0


def check_order(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationsOutOfOrder(versions=versions)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def apply_pending(
    db: sqlite_utils.Database,
    *,
    path: Path,
    migrations: Sequence[Migration],
    now: Callable[[], dt.datetime],
) -> list[int]:
    """Apply every migration newer than the file, each atomically; return the versions applied.

    The connection must be in driver autocommit mode (`isolation_level=None`), as
    `open_database` makes it.
    """
    check_order(migrations)
    known = latest_version(migrations)
    conn = db.conn
    applied: list[int] = []
    for migration in migrations:
        if migration.rebuilds_referenced:
            conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before BEGIN
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            if current > known:
                raise SchemaTooNew(path=path, found=current, known=known)
            if current >= migration.version:
                conn.execute("COMMIT")
                continue
            conn.execute(_SCHEMA_MIGRATIONS)
            if isinstance(migration.apply, str):
                db.executescript(migration.apply)
            else:
                migration.apply(db)
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise StorageError(f"{len(broken)} rows break foreign keys, first: {broken[0]}")
            # PRAGMAs take no parameters; both values are ints from this module.
            conn.execute(f"PRAGMA user_version = {int(migration.version)}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(
                "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.description, codec.time_to_text(now())),
            )
            conn.execute("COMMIT")
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, SchemaTooNew) or not isinstance(err, Exception):
                raise
            raise MigrationFailed(
                path=path, version=migration.version, description=migration.description, cause=err
            ) from err
        finally:
            if migration.rebuilds_referenced:
                conn.execute("PRAGMA foreign_keys = ON")
        applied.append(migration.version)
    return applied
