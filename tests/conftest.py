"""Fixtures shared by every test suite: the real local control plane (built on first use
and started once per session), the GPU Operator CRDs, and fleets set up per test or per
module and removed afterwards."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import freezegun
import pytest

# The kubernetes client loads its modules lazily; a frozen clock must not reach into them,
# nor into pytest's own timing (`--durations` measured a frozen setup as 57 years).
freezegun.configure(extend_ignore_list=["kubernetes", "urllib3", "_pytest.timing"])

# Slack tokens must never leak into tests from the developer's shell.
for _name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running control plane (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler, kwok) for the whole session."""
    from testenv.environment import Environment

    env = Environment(folder=tmp_path_factory.mktemp("controlplane"))
    env.start()
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture(scope="session")
def gpu_operator_crds(cluster):
    """The real GPU Operator CRDs, installed once. Fails (not skips) with how to get them."""
    from testenv.install import CrdsMissing

    try:
        cluster.install_crds()
    except CrdsMissing as err:
        pytest.fail(str(err), pytrace=False)
    return cluster


@pytest.fixture
def fleet(gpu_operator_crds) -> Iterator[Callable]:
    """Apply a fleet for one test: `fleet(spec_or_name, simulate=True)`; removed after."""
    from testenv import fleet as fl

    env = gpu_operator_crds
    if env.fleet is not None:
        pytest.fail(f"fleet {env.fleet.name!r} from a module fixture is still applied; a test that builds "
                    "its own fleet belongs in a module without demo_fleet", pytrace=False)
    applied = []

    def apply(spec: "fl.FleetSpec | str", *, simulate: bool = True, advertise: bool = False):
        spec = fl.load_fleet(spec) if isinstance(spec, str) else spec
        env.apply_fleet(spec, simulate=simulate, advertise=advertise)
        applied.append(spec)
        return spec

    yield apply
    if applied:
        env.delete_fleet()


@pytest.fixture(scope="module")
def demo_fleet(gpu_operator_crds):
    """The demo fleet, converged (every GPU node advertising what it should), for a
    module of tests that leave it as they found it."""
    from testenv import fleet as fl
    from testenv.summary import wait_converged

    env = gpu_operator_crds
    spec = fl.load_fleet("demo")
    env.apply_fleet(spec)
    try:
        wait_converged(env.kubeconfig, timeout=120)
        yield env
    finally:
        env.delete_fleet()


# With parallel workers (`make test` runs pytest-xdist with `--dist loadgroup`), each test
# goes to whichever worker is free next, except that a test file sharing a fixture wider
# than one test (a module's fleet, a second control plane) goes to one worker whole, so it
# is set up once. The suites that wait on a control plane go first and the fast,
# CPU-bound ones fill the gaps at the end: a long control-plane test started last would be
# the whole run's tail.
_FIRST = ("tests/integration/", "tests/reliability/")
_TESTS = Path(__file__).resolve().parent
_WIDE_SCOPE = re.compile(r"""@pytest\.fixture\(\s*scope=["'](?:module|package|class|session)["'][^)]*\)\s*\n\s*def (\w+)""")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(_FIRST))


@functools.cache
def _shared_fixtures() -> frozenset[str]:
    """Fixtures wider than a test that conftest files and the fixtures plugin offer; the
    session-wide ones are one per worker anyway and do not count."""
    names = set()
    for path in (*_TESTS.rglob("conftest.py"), *(_TESTS / "fixtures").glob("*.py")):
        for match in _WIDE_SCOPE.finditer(path.read_text()):
            if "session" not in match.group(0):
                names.add(match.group(1))
    return frozenset(names)


@functools.cache
def _file_shares_a_fixture(path: str) -> bool:
    """Whether a test file defines a fixture wider than a test or asks for a shared one:
    read from its text, as xdist's controller has only the tests' ids. Taking a file for
    one that does not share only costs a second set-up, never a wrong result."""
    try:
        text = (_TESTS.parent / path).read_text()
    except OSError:
        return False
    own = {name for match in _WIDE_SCOPE.finditer(text) if "session" not in match.group(0)
           for name in [match.group(1)]}
    return bool(own) or any(re.search(rf"\b{name}\b", text) for name in _shared_fixtures())


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
    suite = "/".join(parts[:2]) if len(parts) > 2 and parts[0] == "tests" else parts[0].split("::")[0]
    _SUITE_SECONDS[suite] = _SUITE_SECONDS.get(suite, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _SUITE_SECONDS:
        return
    terminalreporter.section("time per suite")
    for suite, seconds in sorted(_SUITE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {suite}")
