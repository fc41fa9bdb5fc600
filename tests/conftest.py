"""What every suite shares: the fixtures plugin (tests/fixtures/), the clock and
environment every test starts from, the `controlplane` marker set by folder, and the time
per suite at the end of a run."""

from __future__ import annotations

import os
from pathlib import Path

import freezegun
import pytest

# The shared fixtures, one definition each (tests/fixtures/__init__.py says which is where).
_CONTROL_PLANE_FIXTURES = "tests.fixtures.controlplane"
pytest_plugins = ["testenv.fakeslack.fixtures", _CONTROL_PLANE_FIXTURES, "tests.fixtures.database", "tests.fixtures.bots"]

# The kubernetes client loads its modules lazily; a frozen clock must not reach into them,
# nor into pytest's own timing (`--durations` measured a frozen setup as 57 years).
freezegun.configure(extend_ignore_list=["kubernetes", "urllib3", "_pytest.timing"])

# Slack tokens must never leak into tests from the developer's shell.
for _name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
    os.environ.pop(_name, None)


# A test is marked by the folder it lives in (tests/README.md): everything under these needs
# the control plane and is marked `controlplane`, so `-m controlplane` / `-m "not
# controlplane"` select by it; nothing elsewhere carries the marker by hand.
_TESTS = Path(__file__).resolve().parent
CONTROL_PLANE_FOLDERS = (_TESTS / "integration", _TESTS / "reliability" / "controlplane")
# The folders `make check` runs: neither a control plane nor a build.
PURE_FOLDERS = (_TESTS / "unit", _TESTS / "e2e", _TESTS / "testenv", _TESTS / "reliability" / "inprocess")


def _uses_the_control_plane(item: pytest.Item) -> bool:
    """Whether the test asks for the suite's `cluster` (a unit test's own fake may have the name)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get("cluster", ()) if info is not None else ()
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == _CONTROL_PLANE_FIXTURES


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in CONTROL_PLANE_FOLDERS):
            item.add_marker(pytest.mark.controlplane)
        elif _uses_the_control_plane(item) and any(item.path.is_relative_to(folder) for folder in PURE_FOLDERS):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("these tests need the control plane (the `cluster` fixture) and so belong in "
                                "tests/integration or tests/reliability/controlplane (tests/README.md):\n  "
                                + "\n  ".join(misplaced))


# Where the suite's time goes, printed at its end (with `--durations=25` in `make test`, the
# slowest tests): each suite folder's total of setup, call and teardown, so a slowdown is
# seen the day it lands.
_SUITE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    suite = "/".join(parts[:2]) if len(parts) > 2 and parts[0] == "tests" else parts[0].split("::")[0]
    _SUITE_SECONDS[suite] = _SUITE_SECONDS.get(suite, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _SUITE_SECONDS:
        return
    terminalreporter.section("time per suite")
    for suite, seconds in sorted(_SUITE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {suite}")
