"""The engine lease's timing, on a fake clock: a holder's claim ends at its own deadline
even if it never runs again, a failed renewal stops it at once, and a candidate takes
over only after the record stayed unchanged for a whole lease duration.

The Lease records live in a small in-memory stand-in for the gateway's four lease
calls, which keeps the API's compare-and-set on resourceVersion; the real API server is
in tests/integration/test_engine_lease.py."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from workflows.engine.lease import EngineLease, LeaseSettings
from workflows.kube.errors import Conflict, NotFound, Unavailable
from workflows.kube.objects import LeaseRecord

T0 = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
SETTINGS = LeaseSettings(namespace="gpuops", name="gpuops-engine", duration=dt.timedelta(seconds=10))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Leases:
    """The API server's side of a Lease: create once, replace only at the version read."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise Unavailable("GET lease: connection refused")

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        self._check()
        if self.record is None:
            raise NotFound("no lease")
        return self.record

    def create_lease(self, namespace: str, name: str, *, holder: str, duration_seconds: int,
                     at: dt.datetime) -> LeaseRecord:
        self._check()
        if self.record is not None:
            raise Conflict("exists")
        self.version += 1
        self.record = LeaseRecord(namespace=namespace, name=name, holder=holder, duration_seconds=duration_seconds,
                                  acquire_time=at, renew_time=at, transitions=0, resource_version=str(self.version))
        return self.record

    def update_lease(self, lease: LeaseRecord) -> LeaseRecord:
        self._check()
        assert self.record is not None
        if lease.resource_version != self.record.resource_version:
            raise Conflict("the object has been modified")
        self.version += 1
        self.record = dataclasses.replace(lease, resource_version=str(self.version))
        return self.record


@pytest.fixture
def world():
    return Leases(), Clock()


def _replica(world, name: str) -> EngineLease:
    leases, clock = world
    return EngineLease(leases, identity=name, settings=SETTINGS, monotonic=clock,  # type: ignore[arg-type]
                       wall=lambda: T0)


def test_a_holder_that_stalls_stops_holding_at_its_own_deadline_without_running_again(world):
    _, clock = world
    a = _replica(world, "a")
    assert a.attempt() and a.held()
    clock.t += 9.9
    assert a.held()
    clock.t += 0.1  # no renewal ran: the process was frozen
    assert not a.held()


def test_a_renewal_that_fails_stops_the_holder_at_once_even_before_its_deadline(world):
    leases, clock = world
    a = _replica(world, "a")
    assert a.attempt()
    clock.t += 3
    leases.down = True
    assert not a.attempt() and not a.held()
    assert a.last_problem.startswith("could not read lease gpuops/gpuops-engine")
    leases.down = False
    clock.t += 1
    assert a.attempt() and a.held()  # the record is still its own


def test_a_candidate_takes_over_only_after_the_record_stayed_unchanged_for_a_whole_lease(world):
    _, clock = world
    a, b = _replica(world, "a"), _replica(world, "b")
    assert a.attempt()
    for _ in range(5):  # a renews every 3s; b keeps seeing a fresh record
        clock.t += 3
        assert a.attempt()
        assert not b.attempt() and b.last_problem == "held by a"
    deadline = a.deadline  # a dies now; b saw its last renewal when it was written
    clock.t += 9.9
    assert not b.attempt()
    clock.t += 0.1
    assert b.attempt() and b.held()
    assert b.acquired_at == [clock.t] and clock.t >= deadline and not a.held()
    # a, back from its stall, cannot renew over b: the version it read is gone.
    assert not a.attempt() and a.last_problem == "held by b"


def test_two_candidates_racing_for_a_free_lease_cannot_both_win(world):
    leases, _ = world
    a, b = _replica(world, "a"), _replica(world, "b")
    a.attempt()
    assert a.held()
    # b read the record before a's write landed: its replace names an old version.
    stale = dataclasses.replace(leases.record, resource_version="0")
    with pytest.raises(Conflict):
        leases.update_lease(dataclasses.replace(stale, holder="b"))
    assert not b.attempt() and not b.held()


def test_a_released_lease_is_free_for_the_next_replica_at_once(world):
    a, b = _replica(world, "a"), _replica(world, "b")
    assert a.attempt()
    a.release()
    assert not a.held()
    assert b.attempt() and b.held()


def test_a_lease_shorter_than_a_second_is_refused():
    with pytest.raises(ValueError, match="at least one second"):
        LeaseSettings(duration=dt.timedelta(milliseconds=500))
