"""A real PostgreSQL server for tests: Debian's `postgresql` package, started per test
session in a temporary folder, never a mock.

`initdb` and `postgres` refuse to run as root, as CI runs: as root both run as the
`postgres` system user the package creates (the data folder, the log and the unix socket
live in a temporary folder owned by it); as anyone else they run as that user. The server
listens on 127.0.0.1 on a free port with a password (so the URLs the tests use carry one,
as a deployment's do), with fsync off: a test database need not survive a power cut
(`durable=True`, for the benchmarks, keeps PostgreSQL's defaults).

One server per test session (per pytest-xdist worker); each test gets a fresh database
copied from a migrated template (`CREATE DATABASE ... TEMPLATE`), which takes tens of
milliseconds where migrating a new one takes hundreds.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from testenv.controlplane import free_port

BINARIES = "/usr/lib/postgresql/*/bin"
PACKAGE = "postgresql"
SUPERUSER = "gpuops"
# A test server's password; it must never show in what gpuops prints (tests assert that).
PASSWORD = "pg-test-secret-4f2a"
TEMPLATE = "gpuops_template"
START_TIMEOUT = 60.0


class PostgresMissing(RuntimeError):
    """The server's binaries are not installed (the message names the Debian package)."""


class PostgresFailed(RuntimeError):
    """The server did not start or answer (the message quotes its log)."""


def server_binaries() -> Path:
    """The newest installed major version's bin folder, or `PostgresMissing`."""
    found = sorted(Path("/").glob(BINARIES.lstrip("/")), key=lambda p: _major(p.parent.name))
    found = [folder for folder in found if (folder / "initdb").exists()]
    if not found:
        raise PostgresMissing(
            f"PostgreSQL's server is not installed (no {BINARIES}/initdb): install Debian's "
            f"`{PACKAGE}` package (apt-get install -y {PACKAGE}); .ci/run installs it when missing")
    return found[-1]


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


def _die_with_parent() -> None:
    # NB: set after the switch to the postgres user (a credential change clears it), so a
    # killed test run leaves no server behind (PR_SET_PDEATHSIG = 1).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


@dataclass
class PostgresServer:
    """A running server; `url(name)` is a database's URL (with the password)."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes]
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def url(self, database: str = "postgres", *, password: str | None = PASSWORD) -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(), autocommit=True)

    def create_database(self, *, template: str | None = None) -> str:
        """A new empty database (or a copy of `template`); its name."""
        name = f"gpuops_test_{os.getpid()}_{next(self._names)}"
        with self.admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # "fast" shutdown: ends sessions, no recovery needed
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_server(*, durable: bool = False) -> PostgresServer:
    """Start a fresh server (see the module docstring); stop it with `stop()`. `durable`
    keeps PostgreSQL's own defaults (fsync, synchronous commit, full page writes), as a
    deployment runs it: for benchmarks that compare it with SQLite, which syncs every
    commit (storage/sqlite_backend.py)."""
    unsafe = [] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    binaries = server_binaries()
    user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="gpuops-postgres-"))
    if user is not None:
        owner = pwd.getpwnam(user)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    password_file = folder / "password"
    password_file.write_text(PASSWORD + "\n")
    if user is not None:
        os.chown(password_file, owner.pw_uid, owner.pw_gid)
    data = folder / "data"
    initdb = subprocess.run(
        [str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, f"--pwfile={password_file}",
         "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
        user=user, capture_output=True, check=False)
    password_file.unlink()
    if initdb.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise PostgresFailed(f"initdb failed: {initdb.stderr.decode(errors='replace')}")
    for attempt in range(3):
        port = free_port()
        with open(folder / "server.log", "ab") as log:
            process = subprocess.Popen(
                [str(binaries / "postgres"), "-D", str(data), "-k", str(folder), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", *unsafe, "-c", "max_connections=200"],
                user=user, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        server = PostgresServer(folder=folder, port=port, process=process)
        if _answers(server):
            return server
        if process.poll() is None:
            process.kill()
            process.wait()
        if "could not bind" not in server.log() or attempt == 2:
            log_text = server.log()
            shutil.rmtree(folder, ignore_errors=True)
            raise PostgresFailed(f"the PostgreSQL server did not start; its log:\n{log_text}")
    raise AssertionError("unreachable")


def _answers(server: PostgresServer) -> bool:
    """Wait until the server accepts a connection (True) or its process ends (False)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with psycopg.connect(server.url(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            time.sleep(0.05)  # the server is still starting: nothing to wait on but its socket
    return False
