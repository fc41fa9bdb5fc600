"""tests/unit/test_storage.py's tests again, on PostgreSQL (`db`, `db_path` and `tamper` from
tests/postgres/conftest.py); those about SQLite's file itself are left out, each with why."""

from __future__ import annotations

from tests.unit.test_storage import *  # noqa: F403

# About SQLite itself, left out here, each with why (PostgreSQL's counterparts, where it
# has them, are in tests/postgres/test_postgres_storage.py).
SQLITE_ONLY = {
    "test_reopening_a_migrated_database_applies_nothing_and_keeps_its_data":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
    "test_the_connection_uses_wal_foreign_keys_full_sync_and_a_busy_timeout":
        "SQLite's PRAGMAs",
    "test_a_database_from_a_newer_gpuops_is_refused_and_left_byte_for_byte_unchanged":
        "the file's bytes",
    "test_a_failing_migration_rolls_back_entirely_and_keeps_the_previous_version":
        "SQLite's Migration objects",
    "test_a_migration_that_succeeds_later_moves_the_version_on":
        "SQLite's Migration objects",
    "test_migrations_must_be_numbered_one_two_three_without_gaps":
        "SQLite's Migration objects",
    "test_threads_opening_a_new_database_at_once_apply_each_migration_exactly_once":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
    "test_an_opener_waits_while_another_is_still_making_the_database_and_then_opens_it_whole":
        "the open-lock file",
    "test_a_database_handle_cannot_be_used_from_another_thread":
        "sqlite3's own thread check",
    "test_a_database_from_before_the_rule_keeps_its_rows_and_refuses_new_self_approvals":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
    "test_a_migration_that_widens_the_step_kinds_keeps_every_step_and_lets_a_run_use_the_new_one":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
    "test_the_migration_that_widens_request_kinds_keeps_every_request_its_approvals_and_the_two_person_rule":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
}
for _name in SQLITE_ONLY:
    del globals()[_name]
