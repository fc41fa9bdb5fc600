"""What every suite shares: the fixtures plugin (tests/fixtures/), the clock and
environment every test starts from, the `controlplane` marker set by folder, and the time
per suite at the end of a run."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import freezegun
import hypothesis
import matplotlib.dates  # noqa: F401 - before any clock is frozen: see below
import pytest

# The shared fixtures, one definition each (tests/fixtures/__init__.py says which is where).
_CONTROL_PLANE_FIXTURES = "tests.fixtures.controlplane"
pytest_plugins = ["testenv.fakeslack.fixtures", _CONTROL_PLANE_FIXTURES, "tests.fixtures.database", "tests.fixtures.postgres",
                  "tests.fixtures.bots"]

# The kubernetes client loads its modules lazily; a frozen clock must not reach into them,
# nor into pytest's own timing (`--durations` measured a frozen setup as 57 years).
freezegun.configure(extend_ignore_list=["kubernetes", "urllib3", "_pytest.timing"])
# matplotlib registers its date converters under the datetime classes of the moment it is
# first imported. First imported under a frozen clock (a picture drawn in a freezegun test),
# it registers freezegun's stand-ins, and every later picture of real times fails to
# convert them: so it is imported above, before any clock is frozen.

# Hypothesis's per-example deadline is a timed assertion: on a busy machine (four workers
# beside a control plane) a slow example fails a property that holds. Properties here
# assert behaviour; how fast they run is the benchmarks' business.
hypothesis.settings.register_profile("gpuops", deadline=None)
hypothesis.settings.load_profile("gpuops")

# Slack tokens must never leak into tests from the developer's shell.
for _name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
    os.environ.pop(_name, None)


# A test is marked by the folder it lives in (tests/README.md): everything under these needs
# the control plane and is marked `controlplane`, so `-m controlplane` / `-m "not
# controlplane"` select by it; nothing elsewhere carries the marker by hand.
_TESTS = Path(__file__).resolve().parent
CONTROL_PLANE_FOLDERS = (_TESTS / "integration", _TESTS / "reliability" / "controlplane")
# Everything under tests/postgres needs a PostgreSQL server (testenv/postgres.py, started
# per session) and is marked `postgres` the same way.
POSTGRES_FOLDERS = (_TESTS / "postgres",)
# The folders `make check` runs: neither a control plane nor a build.
PURE_FOLDERS = (_TESTS / "unit", _TESTS / "e2e", _TESTS / "testenv", _TESTS / "reliability" / "inprocess")


def _uses_the_control_plane(item: pytest.Item) -> bool:
    """Whether the test asks for the suite's `cluster` (a unit test's own fake may have the name)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get("cluster", ()) if info is not None else ()
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == _CONTROL_PLANE_FIXTURES


# With parallel workers (`make test` runs pytest-xdist with `--dist loadgroup`), each test
# goes to whichever worker is free next, except that a test file sharing a fixture wider
# than one test (a module's fleet, a second control plane) goes to one worker whole, so it
# is set up once. The control-plane suites go first and the fast, CPU-bound ones fill the
# gaps at the end: a long control-plane test started last would be the whole run's tail.
_WIDE_SCOPE = re.compile(r"""@pytest\.fixture\(\s*scope=["'](module|package|class)["'][^)]*\)\s*\n\s*def (\w+)""")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in POSTGRES_FOLDERS):
            item.add_marker(pytest.mark.postgres)
        if _needs_the_control_plane(item):
            item.add_marker(pytest.mark.controlplane)
        elif _uses_the_control_plane(item) and any(item.path.is_relative_to(folder) for folder in PURE_FOLDERS):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("these tests need the control plane (the `cluster` fixture) and so belong in "
                                "tests/integration or tests/reliability/controlplane (tests/README.md):\n  "
                                + "\n  ".join(misplaced))
    items.sort(key=lambda item: not _needs_the_control_plane(item))


def _needs_the_control_plane(item: pytest.Item) -> bool:
    return any(item.path.is_relative_to(folder) for folder in CONTROL_PLANE_FOLDERS)


@functools.cache
def _shared_fixtures() -> frozenset[str]:
    """The fixtures wider than a test that conftest files and the fixtures plugin offer."""
    return frozenset(match.group(2) for path in (*_TESTS.rglob("conftest.py"), *(_TESTS / "fixtures").glob("*.py"))
                     for match in _WIDE_SCOPE.finditer(path.read_text()))


@functools.cache
def _file_shares_a_fixture(path: str) -> bool:
    """Whether a test file defines a fixture wider than a test or asks for a shared one:
    read from its text, as xdist's controller has only the tests' ids. Taking a file for
    one that does not share only costs a second set-up, never a wrong result."""
    try:
        text = (_TESTS.parent / path).read_text()
    except OSError:
        return False
    return bool(_WIDE_SCOPE.search(text)) or any(re.search(rf"\b{name}\b", text) for name in _shared_fixtures())


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`, as this suite means it: a test file that shares a fixture is one
    unit of work, every other test is one of its own. (xdist's own loadgroup reads groups
    from marks it writes into test ids, which pytest 9.2 no longer lets it change.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TestOrSharedFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _file_shares_a_fixture(path) else nodeid

    return TestOrSharedFile(config, log)


# Where the suite's time goes, printed at its end (with `--durations=25` in `make test`, the
# slowest tests): each suite folder's total of setup, call and teardown, so a slowdown is
# seen the day it lands.
_SUITE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    depth = 3 if parts[:2] == ["tests", "reliability"] and len(parts) > 3 else 2
    suite = "/".join(parts[:depth]) if len(parts) > depth and parts[0] == "tests" else parts[0].split("::")[0]
    _SUITE_SECONDS[suite] = _SUITE_SECONDS.get(suite, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _SUITE_SECONDS:
        return
    terminalreporter.section("time per suite")
    for suite, seconds in sorted(_SUITE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {suite}")
