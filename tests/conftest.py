"""Fixtures shared by every test suite: the real local control plane (built on first use
and started once per session), the GPU Operator CRDs, and fleets set up per test or per
module and removed afterwards."""

from __future__ import annotations

import os
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
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == cluster.__module__


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
