"""Whether this process can reach its database now (`DatabaseProbe.check()`), for the
readiness probe and for leadership: a replica that cannot reach its database is not ready
and runs none of the leader's work (bot/wiring.py, bot/health.py).

The connections the bot works on cannot tell: an open SQLite connection goes on reading
a file that was deleted, or whose volume went away, through the descriptor it holds, and
`SELECT 1` never touches the file at all. So the probe asks afresh:

- SQLite: a new read-only connection reads the schema's migration rows (a missing, moved
  or unreadable file fails, and so does one another connection holds in exclusive mode);
- PostgreSQL: the same query on one connection of the probe's own, opened again on the
  next check when it failed (a server restarted, a network cut), with a short connect
  timeout and the same keepalives as the bot's connections (a silent server is given up).

Both read the newest schema version recorded in `schema_migrations`: a database a newer
gpuops has migrated (the new pod of a rolling update on PostgreSQL, while the old one still
runs) counts as unreachable for this one, which then stands down rather than write rows in
a shape it does not know.

A failure is one line without the URL's password (`DatabaseLocation.secrets` blanked).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from storage.locations import DatabaseLocation
from storage.postgres_backend import silence_limits
from storage.migrations import latest_version

# Seconds a check may wait: for SQLite's busy lock, for PostgreSQL's connect.
PROBE_TIMEOUT = 2
_NEWEST_VERSION = "SELECT max(version) FROM schema_migrations"


class DatabaseProbe:
    """`check()`: None when the database answers, else why not (safe to show). Thread-safe."""

    def __init__(self, location: DatabaseLocation, *, known: int | None = None) -> None:
        self.location = location
        self._known = latest_version() if known is None else known
        self._lock = threading.Lock()
        self._connection: Any = None  # PostgreSQL only: the probe's own connection

    def check(self) -> str | None:
        with self._lock:
            try:
                if self.location.dialect == "sqlite":
                    found = self._check_sqlite(Path(self.location.target))
                else:
                    found = self._check_postgresql()
            except Exception as err:  # noqa: BLE001 - any failure is "cannot reach", said in one line
                self._drop()
                return self._shown(f"{type(err).__name__}: {err}")
            if found is not None and int(found) > self._known:
                return (f"a newer gpuops migrated it to schema version {found}; this one knows up to "
                        f"{self._known}")
            return None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _check_sqlite(self, path: Path) -> Any:
        if not path.is_file():  # connect would create nothing in read-only mode, but say it plainly
            raise FileNotFoundError(f"{path} is not there")
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=PROBE_TIMEOUT)
        try:
            return conn.execute(_NEWEST_VERSION).fetchone()[0]
        finally:
            conn.close()

    def _check_postgresql(self) -> Any:
        if self._connection is None:
            import psycopg  # only a PostgreSQL deployment needs the driver

            url = str(self.location.target)
            self._connection = psycopg.connect(url, connect_timeout=PROBE_TIMEOUT, autocommit=True,
                                               **silence_limits(url))
        return self._connection.execute(_NEWEST_VERSION).fetchone()[0]

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:  # noqa: BLE001, S110 - a broken connection may not even close
                pass

    def _shown(self, text: str) -> str:
        for secret in sorted(self.location.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text
