"""Where the database is: `database:`, `--database`, `database_url_file:`,
GPUOPS_DATABASE_URL and GPUOPS_DATABASE_URL_FILE take a SQLite path or a PostgreSQL URL;
a password never comes from the configuration file or the command line, and never shows."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from bot.cli import main
from bot.wiring import database_target
from storage.locations import BadDatabaseLocation, database_location
from storage.reachability import DatabaseProbe
from testenv.controlplane import free_port
from workflows.config import ConfigError, GpuopsConfig, load_config


@pytest.mark.parametrize(("text", "dialect", "shown"), [
    ("/var/lib/gpuops/gpuops.db", "sqlite", "/var/lib/gpuops/gpuops.db"),
    ("state/gpuops.db", "sqlite", "state/gpuops.db"),
    ("postgresql://gpuops@db.example:5432/gpuops", "postgresql", "postgresql://gpuops@db.example:5432/gpuops"),
    ("postgres://db.example/gpuops?sslmode=verify-full", "postgresql",
     "postgres://db.example/gpuops?sslmode=verify-full"),
    ("postgresql:///gpuops", "postgresql", "postgresql:///gpuops"),
    ("postgresql://gpuops:s%40cret@db.example/gpuops", "postgresql", "postgresql://gpuops:***@db.example/gpuops"),
    ("postgresql://db.example/gpuops?user=gpuops&password=s3cret", "postgresql",
     "postgresql://db.example/gpuops?user=gpuops&password=***"),
])
def test_a_path_is_sqlite_and_a_postgresql_url_is_postgresql_shown_without_its_password(text, dialect, shown):
    location = database_location(text)

    assert (location.dialect, location.shown, str(location)) == (dialect, shown, shown)
    assert "cret" not in repr(location)


@pytest.mark.parametrize(("text", "says"), [
    ("", "the database location is empty"),
    ("mysql://db.example/gpuops", "mysql:// is not a database gpuops uses"),
    ("postgresql+psycopg://db.example/gpuops", "SQLAlchemy's form"),
    ("sqlite:///var/lib/gpuops/gpuops.db", "given as the file's path itself"),
    ("postgresql://db.example:54x2/gpuops", "the port is not a number from 1 to 65535"),
    ("postgresql://db.example:70000/gpuops", "the port is not a number from 1 to 65535"),
    ("postgresql://db.example", "name the database (postgresql://HOST/DATABASE)"),
    ("postgresql://db.example/gpuops/more", "the path is one database name"),
    ("postgresql://db.example/gpuops#x", "has no '#' part"),
])
def test_a_location_of_the_wrong_shape_is_refused_with_what_is_wrong(text, says):
    with pytest.raises(BadDatabaseLocation) as refused:
        database_location(text)
    assert says in str(refused.value)


def test_a_bad_shape_never_shows_the_password_it_carries():
    with pytest.raises(BadDatabaseLocation) as refused:
        database_location("postgresql://gpuops:hunter2@db.example:99999/gpuops")
    assert "hunter2" not in str(refused.value) and "gpuops:***@" in str(refused.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_url_with_its_password_in_the_configuration_file_is_refused_saying_where_it_goes(tmp_path, capsys):
    path = write(tmp_path, "database: postgresql://gpuops:hunter2@db.example:5432/gpuops\n")

    assert main(["config", "check", str(path)]) == 1

    err = capsys.readouterr().err
    assert f"{path}:1:11: database: postgresql://gpuops:***@db.example:5432/gpuops carries its password" in err
    assert "database_url_file" in err and "GPUOPS_DATABASE_URL" in err and "hunter2" not in err


def test_a_url_without_a_password_and_a_url_file_are_accepted_but_not_both(tmp_path):
    assert load_config(write(tmp_path, "database: postgresql://gpuops@db/gpuops\n")).database == \
        "postgresql://gpuops@db/gpuops"
    assert load_config(write(tmp_path, "database_url_file: /etc/gpuops/db/url\n")).database_url_file == \
        Path("/etc/gpuops/db/url")
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, "database: x.db\ndatabase_url_file: /etc/gpuops/db/url\n"))
    assert "give `database` or `database_url_file`, not both" in str(refused.value)


def test_the_database_is_the_command_line_then_the_environment_then_the_configuration_then_the_default(tmp_path):
    url_file = tmp_path / "url"
    url_file.write_text("postgresql://gpuops:from-file@db/gpuops\n")
    config = GpuopsConfig(database="configured.db")

    assert database_target(config, "explicit.db", env={"GPUOPS_DATABASE_URL": "postgresql://db/x"}).shown == \
        "explicit.db"
    assert database_target(config, None, env={"GPUOPS_DATABASE_URL": "postgresql://u:pw@db/x"}).shown == \
        "postgresql://u:***@db/x"
    from_file = database_target(config, None, env={"GPUOPS_DATABASE_URL_FILE": str(url_file)})
    assert (from_file.shown, from_file.target) == ("postgresql://gpuops:***@db/gpuops",
                                                   "postgresql://gpuops:from-file@db/gpuops")
    assert database_target(GpuopsConfig(database_url_file=url_file), None, env={}).dialect == "postgresql"
    assert database_target(config, None, env={}).target == Path("configured.db")
    assert database_target(GpuopsConfig(), None, env={}).target == Path(".gpuops") / "gpuops.db"


@pytest.mark.parametrize(("env", "says"), [
    ({"GPUOPS_DATABASE_URL": "postgresql://db/x", "GPUOPS_DATABASE_URL_FILE": "/x"},
     "both GPUOPS_DATABASE_URL and GPUOPS_DATABASE_URL_FILE are set"),
    ({"GPUOPS_DATABASE_URL_FILE": "/nonexistent/url"}, "GPUOPS_DATABASE_URL_FILE names /nonexistent/url, which "
                                                       "cannot be read"),
    ({"GPUOPS_DATABASE_URL": "mysql://db/x"}, "mysql:// is not a database gpuops uses"),
])
def test_a_database_url_from_the_environment_that_cannot_be_used_says_why(env, says):
    with pytest.raises(BadDatabaseLocation) as refused:
        database_target(GpuopsConfig(), None, env=env)
    assert says in str(refused.value)


def test_an_empty_url_file_is_refused(tmp_path):
    empty = tmp_path / "url"
    empty.write_text("\n")
    with pytest.raises(BadDatabaseLocation) as refused:
        database_target(GpuopsConfig(database_url_file=empty), None, env={})
    assert str(refused.value) == f"database_url_file names {empty}, which is empty: it should hold the " \
                                 "postgresql:// URL."


def test_a_password_on_the_command_line_is_refused_without_showing_it():
    with pytest.raises(BadDatabaseLocation) as refused:
        database_target(GpuopsConfig(), "postgresql://gpuops:hunter2@db/gpuops", env={})
    assert "postgresql://gpuops:***@db/gpuops carries its password" in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_the_password_of_a_url_from_the_environment_never_shows_in_the_log():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        location = database_target(GpuopsConfig(), None,
                                   env={"GPUOPS_DATABASE_URL": "postgresql://gpuops:n0t-in-logs@db/gpuops"})
        logging.getLogger("gpuops.test").warning("could not reach %s", location.target)
    finally:
        root.removeHandler(handler)
    assert stream.getvalue() == "could not reach postgresql://gpuops:[redacted]@db/gpuops\n"


def test_a_postgresql_server_that_does_not_answer_is_unreachable_with_a_reason_that_hides_the_password():
    probe = DatabaseProbe(database_location(f"postgresql://gpuops:n0t-shown@127.0.0.1:{free_port()}/gpuops"))
    try:
        problem = probe.check()
    finally:
        probe.close()
    assert problem is not None and problem.startswith("OperationalError: ")
    assert "n0t-shown" not in problem
