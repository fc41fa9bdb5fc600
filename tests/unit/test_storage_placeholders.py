"""The repositories' one SQL text in psycopg's words (storage/postgres_backend.py), and the
URL as gpuops shows it: pure functions, no server."""

from __future__ import annotations

import pytest

from storage.postgres_backend import redacted, to_psycopg


@pytest.mark.parametrize(("common", "psycopg"), [
    ("SELECT * FROM kv WHERE key = ?", "SELECT * FROM kv WHERE key = %s"),
    ("UPDATE t SET a = :new WHERE id = :id", "UPDATE t SET a = %(new)s WHERE id = %(id)s"),
    ("SELECT '?', 'it''s ?' FROM t WHERE a = ?", "SELECT '?', 'it''s ?' FROM t WHERE a = %s"),
    ('SELECT "odd?name" FROM t WHERE a LIKE \'50%\' AND b = ?',
     'SELECT "odd?name" FROM t WHERE a LIKE \'50%%\' AND b = %s'),
    ("SELECT a % 2, ? FROM t", "SELECT a %% 2, %s FROM t"),
    ("SELECT ':notaname', x::text FROM t WHERE y = ?", "SELECT ':notaname', x::text FROM t WHERE y = %s"),
])
def test_placeholders_become_psycopgs_outside_quoted_text_and_a_percent_is_doubled(common, psycopg):
    assert to_psycopg(common) == psycopg


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://gpuops:s3cret@db.example:5432/gpuops", "postgresql://gpuops:***@db.example:5432/gpuops"),
    ("postgresql://gpuops@db/gpuops?sslmode=require", "postgresql://gpuops@db/gpuops?sslmode=require"),
    ("postgresql://db/gpuops?user=gpuops&password=s3cret", "postgresql://db/gpuops?user=gpuops&password=***"),
    ("postgres://u:p%40ss@h/d", "postgres://u:***@h/d"),
])
def test_a_url_is_shown_with_its_password_replaced(url, shown):
    assert redacted(url) == shown
