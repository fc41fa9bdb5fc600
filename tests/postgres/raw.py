"""A raw PostgreSQL connection for tests that go behind gpuops's back (tampering, a
foreign database), taking the same `?` SQL as sqlite3's connections do."""

from __future__ import annotations

from typing import Any

import psycopg

from storage.postgres_backend import to_psycopg


class RawPostgres:
    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> psycopg.Cursor[Any]:
        if params:
            return self._conn.execute(to_psycopg(sql), params)
        return self._conn.execute(sql.encode())

    def close(self) -> None:
        self._conn.close()
