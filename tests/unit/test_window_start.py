"""The window rule (workflows.engine.window_start): an approved request's run starts at
its window, never late. A table of literal times for when a window counts as missed,
then the rule applied to requests on a real SQLite database under a frozen clock, as the
leader's scheduler applies it at each tick."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.engine.window_start import START_GRACE, start_at_window, window_missed
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
START = dt.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)
END = START + dt.timedelta(hours=1)
CONFIG = GpuopsConfig.model_validate({
    "pools": {"serve-b": {"kind": "serving", "windows": "always", "approvals": {"drain": 0}}},
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]},
               "names": {"U0ALICE": "alice", "U0ERIN": "erin"}},
})
ALICE, ERIN = CONFIG.actor("U0ALICE"), CONFIG.actor("U0ERIN")


@pytest.mark.parametrize(("now", "approved_at", "missed"), [
    (START - MINUTE, NOW, False),                        # not begun yet
    (START, NOW, False),                                 # at its start
    (START + START_GRACE, NOW, False),                   # the last moment of the grace
    (START + START_GRACE + dt.timedelta(seconds=1), NOW, True),   # a second later: missed
    (START + 20 * MINUTE, START + 15 * MINUTE, False),   # approved inside the window: may start then
    (END - dt.timedelta(seconds=1), START + 15 * MINUTE, False),
    (END, START + 15 * MINUTE, True),                    # the window ended
    (END + dt.timedelta(days=1), NOW, True),
])
def test_a_window_is_missed_once_it_ends_or_its_start_is_more_than_the_grace_behind(now, approved_at, missed):
    assert window_missed(start=START, end=END, approved_at=approved_at, now=now) is missed


def test_a_request_without_a_window_is_never_missed():
    assert not window_missed(start=None, end=None, approved_at=NOW, now=NOW + dt.timedelta(days=30))


def services_on(make, tmp_path: Path, config: GpuopsConfig) -> Iterator[Services]:
    """Services of `config` over two serve-b nodes, on a database file of their own."""
    nodes = [make.node(f"gpu-b-{n:02d}", pool="serve-b") for n in (1, 2)]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    db = open_database(tmp_path / "gpuops.db")
    yield Services.on_database(config=config, fleet=StaticFleet(make.fleet(nodes, pods)), database=db)
    db.close()


@pytest.fixture
def services(make, tmp_path: Path):
    yield from services_on(make, tmp_path, CONFIG)


def approved(services: Services, *, start: dt.datetime | None = START, end: dt.datetime | None = END):
    node = NodeName("gpu-b-01")
    plan = Plan(kind="drain", pool="serve-b", created_for="U0ALICE",
                summary=PlanSummary(window_start=start, window_end=end),
                waves=(Wave(0, (node,), tuple(NodeStep(k, node, {}) for k in ("cordon", "hold", "uncordon"))),))
    return services.requests.submit(ALICE, kind="drain", pool="serve-b", targets=["gpu-b-01"],  # type: ignore[union-attr]
                                    plan=plan, window_start=start, window_end=end, reason="NIC swap",
                                    now=dt.datetime.now(UTC),
                                    channel="C0OPS")


def tick(services: Services, request_id: str):
    """What the scheduler does for one request at one tick: read it, apply the rule."""
    db = services.database
    requests = RequestService(db, CONFIG)  # type: ignore[arg-type]
    view = requests.get(request_id)
    return start_at_window(db, view, requests=requests, runs=RunService(db, requests=requests),  # type: ignore[arg-type]
                           now=dt.datetime.now(UTC))


def test_an_approved_request_waits_for_its_window_and_its_run_starts_at_the_start(services):
    with freeze_time(NOW) as frozen:
        request = approved(services)
        assert request.state == "approved"
        waits = tick(services, request.id)
        frozen.move_to(START)
        started = tick(services, request.id)

    assert (waits.outcome, waits.next_start, waits.changed) == ("waits for its window", START, False)
    assert started.outcome == "started" and started.changed
    assert [r.state for r in services.runs.for_request(request.id)] == ["pending"]  # type: ignore[union-attr]


def test_a_request_whose_window_began_more_than_the_grace_ago_is_marked_missed_told_once_and_never_started(services):
    with freeze_time(NOW) as frozen:
        request = approved(services)
        frozen.move_to(START + START_GRACE + MINUTE)  # no leader while the window began
        first = tick(services, request.id)
        again = tick(services, request.id)

    assert first.outcome == "missed" and first.changed
    assert again.outcome == "not runnable" and not again.changed  # a later tick does not start it late
    assert services.runs.for_request(request.id) == []  # type: ignore[union-attr]
    assert services.requests.get(request.id).state == "missed"  # type: ignore[union-attr]
    told = services.database.query(  # type: ignore[union-attr]
        "SELECT payload FROM outbox WHERE payload LIKE '%request.missed%'")
    assert len(told) == 1


def test_a_request_approved_inside_its_window_starts_then_even_past_the_grace(services):
    with freeze_time(START + 20 * MINUTE):
        request = approved(services)
        started = tick(services, request.id)

    assert started.outcome == "started"


def test_a_change_freeze_holds_the_start_and_the_first_tick_after_it_starts_the_run_within_the_grace(services):
    with freeze_time(NOW) as frozen:
        request = approved(services)
        froze = dispatch("freeze serve-b until 10:32 launch", actor=ERIN, services=services, now=NOW,
                         channel="C0OPS")
        assert froze.ok, froze.text
        frozen.move_to(START)
        held = tick(services, request.id)
        frozen.move_to(START + 3 * MINUTE)
        started = tick(services, request.id)

    assert held.outcome == "frozen" and not held.changed
    assert started.outcome == "started"
