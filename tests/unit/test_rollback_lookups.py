"""Why a run cannot be rolled back now, and which requests roll back or continue a run
(workflows.requests.rollbacks), through `RequestService` on a real SQLite file: the
refusal's code and sentence as `/gpu rollback` gives them, and that only the run's own
pool, in the run's own cluster, is looked at. Two clusters share one database and both
call a pool `train`, as in tests/unit/test_clusters.py."""

from __future__ import annotations

import datetime as dt

import pytest

from storage.step_params import ContinuesMark, StepParamsError, TakesOverMark
from tests.unit.test_clusters import POOL
from workflows.config import GpuopsConfig
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests import messages as say
from workflows.requests.records import LIST_LIMIT
from workflows.requests.rollbacks import continues, plan_takes_over
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.timezone.utc)
RUN = "run-0ld001"
CONFIG = GpuopsConfig.model_validate({
    "clusters": {
        "east": {"home": True, "pools": {"train": POOL, "serve": POOL}},
        "west": {"kubeconfig": "/k", "channels": ["C0WEST"], "pools": {"train": POOL}},
    },
    "access": {"users": {"U0ALICE": ["operator"]}, "names": {"U0ALICE": "alice"}},
})


def east(db) -> RequestService:
    return RequestService(db, CONFIG.for_cluster("east"))


def west(db) -> RequestService:
    return RequestService(db, CONFIG.for_cluster("west"))


def ask(requests: RequestService, *marks: ContinuesMark | TakesOverMark, pool: str = "train",
        node: str = "gpu-01", at: dt.datetime = NOW) -> RequestView:
    """A drain of `node` (approved as it is filed: the pool needs no approval) whose cordon
    carries `marks`: a rollback's `TakesOverMark`, a continuation's `ContinuesMark` too."""
    params: dict[str, object] = {}
    for mark in marks:
        params = mark.written_into(params)
    plan = Plan(kind="drain", pool=pool, summary=PlanSummary(), created_for="U0ALICE",
                waves=(Wave(0, (NodeName(node),), (NodeStep("cordon", NodeName(node), params),)),))
    return requests.submit(CONFIG.actor("U0ALICE"), kind="drain", pool=pool, targets=[node], plan=plan,
                           window_start=None, window_end=None, reason="disk swap", channel="C0OPS", now=at)


def rollback_of(requests: RequestService, run: str, **where) -> RequestView:
    return ask(requests, TakesOverMark(takes_over=run), **where)


def continuation_of(requests: RequestService, run: str, **where) -> RequestView:
    return ask(requests, ContinuesMark(continues=run), TakesOverMark(takes_over=run), **where)


# ------------------------------------------------------------------ why a rollback is refused


@pytest.mark.parametrize("state", ["pending", "running", "paused"])
def test_a_run_that_has_not_finished_is_not_rolled_back_and_the_refusal_says_its_state(db, state):
    assert east(db).rollback_blocked(RUN, state=state, pool="train") == (
        "run-unfinished", say.rollback_unfinished(RUN, state))
    assert say.rollback_unfinished(RUN, state).startswith(f"run {RUN} is {state}: abort it")


@pytest.mark.parametrize("state", ["succeeded", "failed", "aborted"])
def test_a_finished_run_nobody_rolls_back_or_continues_may_be_rolled_back(db, state):
    requests = east(db)
    ask(requests)  # a drain of the pool that takes over nothing

    assert requests.rollback_blocked(RUN, state=state, pool="train") is None


def test_a_second_rollback_of_the_same_run_is_refused_naming_the_first(db):
    requests = east(db)
    first = rollback_of(requests, RUN)

    assert requests.rollback_asked(RUN, pool="train") == first
    assert requests.rollback_blocked(RUN, state="failed", pool="train") == (
        "rollback-asked", say.rollback_already_asked(RUN, first.id))
    # Another run's rollback is no rollback of this one.
    assert requests.rollback_blocked("run-other1", state="failed", pool="train") is None


def test_a_run_whose_continuation_is_open_is_not_rolled_back_and_the_refusal_names_it(db):
    requests = east(db)
    continuing = continuation_of(requests, RUN)

    # Its cordon takes the run's over, yet it is a continuation, not a rollback.
    assert requests.rollback_asked(RUN, pool="train") is None
    assert requests.continuation_of(RUN, pool="train") == continuing
    assert requests.rollback_blocked(RUN, state="failed", pool="train") == (
        "continuation-open", say.rollback_while_continued(RUN, continuing.id))


def test_a_rollback_or_continuation_asked_in_another_pool_does_not_hold_up_this_pools_run(db):
    requests = east(db)
    rollback = rollback_of(requests, RUN, pool="serve", node="gpu-07")
    continuing = continuation_of(requests, RUN, pool="serve", node="gpu-08")

    assert requests.rollback_asked(RUN, pool="train") is None
    assert requests.continuation_of(RUN, pool="train") is None
    assert requests.rollback_blocked(RUN, state="failed", pool="train") is None
    # In their own pool, both are found.
    assert requests.rollback_asked(RUN, pool="serve") == rollback
    assert requests.continuation_of(RUN, pool="serve") == continuing


def test_a_continuation_in_another_cluster_with_the_same_pool_name_is_that_clusters_alone(db):
    continuing = continuation_of(west(db), RUN, node="gpu-w-01")

    assert east(db).continuation_of(RUN, pool="train") is None
    assert east(db).rollback_blocked(RUN, state="failed", pool="train") is None
    assert west(db).continuation_of(RUN, pool="train") == continuing
    assert west(db).rollback_blocked(RUN, state="failed", pool="train") == (
        "continuation-open", say.rollback_while_continued(RUN, continuing.id))


def test_a_continuation_is_still_found_after_more_than_a_hundred_newer_requests_of_its_pool(db):
    requests = east(db)
    continuing = continuation_of(requests, RUN)
    # More requests of the pool filed since than a default read of 100 rows would reach,
    # all still open (approved), yet fewer than the lists' limit.
    newer = 101
    assert newer < LIST_LIMIT
    for n in range(newer):
        ask(requests, node=f"gpu-{n + 2:03d}", at=NOW + dt.timedelta(minutes=n + 1))

    assert requests.continuation_of(RUN, pool="train") == continuing
    assert requests.rollback_blocked(RUN, state="failed", pool="train") == (
        "continuation-open", say.rollback_while_continued(RUN, continuing.id))


# ------------------------------------------------------------------ the marks a plan carries


def test_a_mark_of_the_wrong_shape_is_refused_naming_the_step_that_carries_it():
    def plan(params: dict[str, object]) -> Plan:
        node = NodeName("gpu-01")
        return Plan(kind="drain", pool="train", summary=PlanSummary(), created_for="U0ALICE",
                    waves=(Wave(0, (node,), (NodeStep("cordon", node, params),)),))

    with pytest.raises(StepParamsError) as continuing:
        continues(plan({"continues": 7}))
    with pytest.raises(StepParamsError) as taking_over:
        plan_takes_over(plan({"takes_over": 7}), RUN)

    assert str(continuing.value) == "cordon step: params.continues must be text, not 7"
    assert str(taking_over.value) == "cordon step: params.takes_over must be text, not 7"
