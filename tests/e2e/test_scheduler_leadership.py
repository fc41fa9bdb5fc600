"""Leadership in `gpuops run`, with a lease the test holds and drops: the replica holding
it runs the scheduler and the notifier (the outbox reaches Slack), losing it stops both
at once, regaining it starts them afresh; a replica that never holds it delivers nothing.
(The Kubernetes Lease itself is tested against a real API server in
tests/integration/test_engine_lease.py; the engine needs that server too.)"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from bot import scheduler as scheduler_module
from bot.slack_api import web_client
from bot.wiring import Leadership, NotifierWorker, SchedulerWorker, ThreadWorker
from testenv.fakeslack import FakeSlackWebApi
from testenv.install import wait_until
from tests.e2e.harness import CHANNEL, a_plan, submit_upgrade


class TestLease:
    """A lease whose holding the test decides; tells the leadership like EngineLease."""

    __test__ = False

    def __init__(self, held: bool = False) -> None:
        self._held = held
        self.leadership: Leadership | None = None
        self.released = False

    def held(self) -> bool:
        return self._held

    def start(self) -> TestLease:
        return self

    def stop(self, *, release: bool = True) -> None:
        self.released = release

    def set(self, held: bool) -> None:
        self._held = held
        if self.leadership is not None:
            self.leadership.changed(held)


@pytest.fixture
def client(slack: FakeSlackWebApi):
    return web_client(slack.bot_token, base_url=slack.base_url)


def kinds(leadership: Leadership) -> set[str]:
    return {w.name for w in leadership.workers}


def test_the_lease_holder_runs_the_scheduler_and_the_notifier_and_its_outbox_reaches_slack(
        slack, runtime, client):
    lease = TestLease(held=True)
    leadership = runtime.start_background("replica-a", slack=client, lease=lease)
    try:
        leadership.wait_until(True)
        assert kinds(leadership) == {"notifier", "scheduler"}  # no Kubernetes API here: no engine

        view = submit_upgrade(runtime)
        runtime.notify()

        post = slack.wait_for("chat.postMessage")
        assert view.id in post.args["text"]
    finally:
        runtime.close()
    assert lease.released and not leadership.leading


def test_losing_the_lease_stops_the_scheduler_and_notifier_at_once_and_regaining_starts_them_afresh(
        slack, runtime, client):
    lease = TestLease(held=True)
    leadership = runtime.start_background("replica-a", slack=client, lease=lease, check_every=3600)
    lease.leadership = leadership
    try:
        leadership.wait_until(True, terms=1)
        first_term = leadership.workers

        lease.set(False)
        leadership.wait_until(False)

        notifier = next(w for w in first_term if isinstance(w, NotifierWorker)).notifier
        scheduler = next(w for w in first_term if isinstance(w, SchedulerWorker)).scheduler
        assert not notifier.running and not scheduler.running and leadership.workers == []
        assert notifier.deliver_due() == 0  # and the lease is asked before every action anyway

        view = submit_upgrade(runtime)  # queued while no one here leads
        lease.set(True)
        leadership.wait_until(True, terms=2)

        post = slack.wait_for("chat.postMessage", lambda c: view.id in c.args.get("text", ""))
        assert post.ok
        assert all(w not in first_term for w in leadership.workers)
    finally:
        runtime.close()


def test_a_claim_that_runs_out_without_a_callback_still_ends_the_term(slack, runtime, client):
    lease = TestLease(held=True)  # never calls back: the supervisor's own check must notice
    leadership = runtime.start_background("replica-a", slack=client, lease=lease, check_every=0.02)
    try:
        leadership.wait_until(True)
        lease._held = False
        leadership.wait_until(False)
    finally:
        runtime.close()


def test_a_replica_that_never_holds_the_lease_runs_nothing_but_answers_slack(slack, runtime, client):
    lease = TestLease(held=False)
    leadership = runtime.start_background("replica-b", slack=client, lease=lease, check_every=0.02)
    try:
        submit_upgrade(runtime)
        runtime.notify()
        leadership.wait_until(False, checks=5)  # it looked at the lease five times
        assert leadership.workers == [] and leadership.terms == 0
        assert slack.calls("chat.postMessage") == []
    finally:
        runtime.close()


def test_a_leader_worker_that_dies_is_started_again():
    calls: list[int] = []
    restarted = threading.Event()

    def body(stop: threading.Event) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the engine hit a bug")
        restarted.set()
        stop.wait()

    worker = ThreadWorker("engine", body, restart_after=0.01).start()
    try:
        assert restarted.wait(5)
    finally:
        worker.stop()
        assert worker.join(5)
    assert len(calls) == 2


def test_a_request_approved_inside_its_open_window_starts_its_run_at_once_not_at_the_next_tick(
        runtime, monkeypatch):
    # The timer would look only in an hour: what starts the run is the approval itself.
    monkeypatch.setattr(scheduler_module, "WINDOW_CHECK", dt.timedelta(hours=1))
    lease = TestLease(held=True)
    leadership = runtime.start_background("replica-a", slack=None, lease=lease)
    try:
        leadership.wait_until(True)
        (scheduler,) = [w.scheduler for w in leadership.workers if isinstance(w, SchedulerWorker)]
        scheduler.runs.wait_for(lambda rs: any(r.job == "window-starts" for r in rs))
        now = dt.datetime.now(dt.timezone.utc)
        services = runtime.services()
        view = services.requests.submit(
            runtime.config.actor("U0ALICE"), kind="upgrade", pool="serving-a", targets=["serving-a-000"],
            plan=a_plan("serving-a"), window_start=now, window_end=now + dt.timedelta(minutes=1),
            reason="a one-minute window", channel=CHANNEL, now=now)
        for approver in ("U0BOB", "U0CAROL"):
            view = services.requests.approve(runtime.config.actor(approver), view.id, plan_hash=view.plan_hash,
                                             now=dt.datetime.now(dt.timezone.utc))
        assert view.state == "approved"

        scheduler.runs.wait_for(lambda rs: sum(r.job == "window-starts" for r in rs) >= 2)
        wait_until(lambda: runtime.services().runs.for_request(view.id), timeout=5, what="the run to start")
    finally:
        runtime.close()
    assert runtime.services().requests.get(view.id).state == "running"
