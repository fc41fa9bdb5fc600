"""Why a request or its run waits, in the one sentence `/gpu request`, the console and
App Home show: built from plain values (a request, its runs and steps as storage holds
them, the freeze over its pool), at a given time."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from storage.freezes import FreezeId
from storage.ids import RequestId, RunId, StepId
from storage.runs import Run
from storage.steps import Step
from workflows.engine.runs import WAITING, RunView
from workflows.engine.waits import why_waiting
from workflows.pools.freezes import Freeze
from workflows.requests.views import RequestView
from tests.unit.test_handover_checklist import request_view

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
MINUTE = dt.timedelta(minutes=1)


def step(seq: int, node: str, kind: str, state: str, *, waiting: str | None = None, started_min_ago: int = 1) -> Step:
    detail = {"params": {}, **({WAITING: waiting} if waiting else {})}
    return Step(id=StepId(seq), run_id=RunId("run-aaa111"), wave=0, node=node, seq=seq, kind=kind,  # type: ignore[arg-type]
                state=state, attempt=1, started_at=NOW - started_min_ago * MINUTE if state != "pending" else None,  # type: ignore[arg-type]
                ended_at=None, detail=detail, error=None)


def run_view(state: str, steps: tuple[Step, ...] = (), *, waiting: str | None = None) -> RunView:
    run = Run(id=RunId("run-aaa111"), request_id=RequestId("req-aaa111"), state=state, dry_run=False,  # type: ignore[arg-type]
              current_wave=0, created_at=NOW - 10 * MINUTE, started_at=NOW - 9 * MINUTE, ended_at=None,
              halted_reason=None, waiting=waiting)
    return RunView(run=run, request_id=run.request_id, pool="train-a", kind="drain", steps=steps, left_cordoned=())


def running() -> RequestView:
    return request_view("req-aaa111", state="running", expires_at=NOW + 10 * MINUTE)


def test_a_pending_request_waits_for_the_approvals_it_lacks_from_who_could_give_them():
    view = request_view("req-aaa111", state="pending", expires_at=NOW + 60 * MINUTE, counted=1, required=2,
                        approvers=("bob",))

    assert why_waiting(view, [], now=NOW, approvers=["carol", "erin"]) == (
        "Waits for 1 more approval (1/2 so far) from carol or erin.")
    assert why_waiting(view, [], now=NOW) == "Waits for 1 more approval (1/2 so far) from an approver of train-a."
    assert why_waiting(view, [], now=NOW + 61 * MINUTE) is None  # expired: it waits for nothing any more


def test_an_approved_request_waits_for_its_window_or_a_freeze_and_not_once_its_window_is_open():
    view = request_view("req-aaa111", state="approved", expires_at=NOW, window_start=NOW + 90 * MINUTE)
    freeze = Freeze(id=FreezeId(1), target="train-a", until=NOW + 120 * MINUTE, reason="incident 4711",
                    let_running_finish=False, set_by="U0ERIN", set_by_name="erin", created_at=NOW - MINUTE,
                    lifted_at=None, lifted_by=None, lifted_by_name=None, lift_reason=None, replaced_by=None)

    assert why_waiting(view, [], now=NOW) == "Waits for its window, which opens at 2025-06-07 13:30 UTC; the run starts then."
    assert why_waiting(view, [], now=NOW, zone=zoneinfo.ZoneInfo("Europe/Berlin")) == (
        "Waits for its window, which opens at 2025-06-07 15:30 CEST; the run starts then.")
    assert why_waiting(view, [], now=NOW, freeze=freeze) == (
        "Waits for the freeze of pool train-a (by erin until 2025-06-07 14:00 UTC: incident 4711) to end; "
        "it goes on by itself then.")
    assert why_waiting(view, [], now=NOW + 91 * MINUTE) is None


def test_a_running_request_says_what_its_run_waits_for_a_paused_run_first_then_the_wave_then_a_step():
    blocked = step(2, "gpu-02", "evict", "running", waiting="eviction of llm/a is blocked by a PodDisruptionBudget: no",
                   started_min_ago=5)
    held = step(1, "gpu-01", "hold", "running", waiting="held until `drain done`", started_min_ago=8)

    assert why_waiting(running(), [run_view("paused", (blocked,))], now=NOW) == (
        "Waits for someone to resume run run-aaa111: it is paused, steps in flight finish and nothing new starts "
        "(`/gpu resume run-aaa111`).")
    assert why_waiting(running(), [run_view("running", waiting="Wave 2 waits: max_unavailable")], now=NOW) == (
        "Wave 2 waits: max_unavailable")
    # A hold waits as planned: the blocked eviction is what a person must hear of.
    assert why_waiting(running(), [run_view("running", (held, blocked))], now=NOW) == (
        "Waits on gpu-02 (evict) (and 1 more node under way): eviction of llm/a is blocked by a "
        "PodDisruptionBudget: no.")
    assert why_waiting(running(), [run_view("running", (held,))], now=NOW) == (
        "Waits on gpu-01 (hold): held until `drain done`.")
    assert why_waiting(running(), [run_view("running", (step(3, "gpu-03", "cordon", "pending"),))], now=NOW) is None
