"""The wait-for-jobs step one call at a time, over the in-memory cluster: a plan names a
label selector, and the node is not touched further while a pod matching it is still
pending or running there. Pods that finished (Succeeded, Failed), that are already
terminating, that do not match, or that run on another node do not hold it. Its note
names the pods it waits for, and it looks again every few seconds; a dry run looks once
and says what it would wait for. At its timeout (an hour unless the plan says otherwise)
it fails, unless the plan said `on_timeout: continue`, when it carries on and says which
pods still run. A plan without a selector is refused before the step starts, and the
intent on record says the selector and what happens at the timeout.

The context is tests/unit/test_step_outcomes.py's; the sentences are the ones
workflows.engine.messages writes."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.unit.test_step_outcomes import NOW, Ctx
from workflows.engine.steps.contract import Done, StepParamsError, Waiting
from workflows.engine.steps.waiting import WaitForJobs

SELECTOR = "job-name=burn"
# How soon the step looks again while matching pods still run (seconds).
SOON = 5.0
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def jobs(fake_cluster, make):
    """gpu-01 with the burn job's pods in every phase, and pods that must not count."""
    fake_cluster.add_node(make.node("gpu-01"))
    fake_cluster.add_node(make.node("gpu-02"))

    def job_pod(name: str, *, node: str = "gpu-01", labels: dict[str, str] | None = None, **kw) -> None:
        pod = make.pod(node=node, name=name, namespace="ml", owner_kind="Job",
                       labels={"job-name": "burn"} if labels is None else labels, **kw)
        fake_cluster.add_pod(pod, uid=f"uid-{name}")

    job_pod("train", phase="Running")
    job_pod("queued", phase="Pending", ready=False)
    job_pod("succeeded", phase="Succeeded", ready=False)
    job_pod("failed", phase="Failed", ready=False)
    job_pod("leaving", phase="Running", deleting=True)
    job_pod("leaving-early", phase="Pending", ready=False, deleting=True)
    job_pod("notebook", phase="Running", labels={"app": "notebook"})
    job_pod("elsewhere", phase="Running", node="gpu-02")
    return fake_cluster


def started(cluster, *, dry_run: bool = False, deadline: dt.datetime | None = None, now: dt.datetime = NOW,
            **params) -> Ctx:
    """The step's context once the engine ran `prepare` with the selector (and `params`)."""
    ctx = Ctx(cluster, kind="wait-for-jobs", params={"selector": SELECTOR, **params}, dry_run=dry_run,
              deadline=deadline, now=now)
    ctx.intent = WaitForJobs().prepare(ctx)  # type: ignore[arg-type]
    return ctx


def finish(cluster, *names: str) -> None:
    for name in names:
        cluster.terminate(f"uid-{name}")


# --- params and timeout --------------------------------------------------------------------


def test_a_wait_for_jobs_step_may_take_an_hour_unless_its_params_say_otherwise(fake_cluster):
    assert WaitForJobs().timeout(Ctx(fake_cluster, kind="wait-for-jobs", params={"selector": SELECTOR})) == HOUR
    assert WaitForJobs().timeout(Ctx(fake_cluster, kind="wait-for-jobs",
                                     params={"selector": SELECTOR, "timeout_s": 60})) == dt.timedelta(minutes=1)


@pytest.mark.parametrize("params", [{}, {"selector": ""}, {"selector": None}])
def test_a_wait_for_jobs_step_without_a_selector_is_refused_saying_what_it_needs(fake_cluster, params):
    with pytest.raises(StepParamsError, match=r"^wait-for-jobs needs a label selector in params\.selector$"):
        WaitForJobs().prepare(Ctx(fake_cluster, kind="wait-for-jobs", params=params))  # type: ignore[arg-type]


def test_the_intent_on_record_names_the_selector_and_fails_at_the_timeout_unless_told_to_carry_on(fake_cluster):
    assert started(fake_cluster).intent == {"selector": SELECTOR, "on_timeout": "fail"}
    assert started(fake_cluster, on_timeout="continue").intent == {"selector": SELECTOR, "on_timeout": "continue"}


# --- waiting ---------------------------------------------------------------------------------


def test_pending_and_running_pods_of_the_selector_on_the_node_keep_it_waiting_and_are_named(jobs):
    ctx = started(jobs)

    assert WaitForJobs().advance(ctx) == Waiting("waiting for ml/queued, ml/train to finish", retry_in=SOON)  # type: ignore[arg-type]

    finish(jobs, "queued")
    assert WaitForJobs().advance(ctx) == Waiting("waiting for ml/train to finish", retry_in=SOON)  # type: ignore[arg-type]


def test_the_step_is_done_once_only_finished_terminating_and_other_pods_are_left(jobs):
    ctx = started(jobs)
    finish(jobs, "train", "queued")

    assert WaitForJobs().advance(ctx) == Done("no pod matching job-name=burn runs here")  # type: ignore[arg-type]
    # Nothing read or written on the way: the step only looks.
    assert jobs.writes == [] and ctx.acts == 0


def test_a_dry_run_looks_once_and_says_which_pods_it_would_wait_for(jobs):
    outcome = WaitForJobs().advance(started(jobs, dry_run=True))  # type: ignore[arg-type]

    assert outcome == Done("would wait for ml/queued, ml/train to finish")


# --- the timeout -------------------------------------------------------------------------------


def test_at_its_timeout_a_step_told_to_continue_carries_on_naming_the_pods_still_running(jobs):
    before = started(jobs, on_timeout="continue", deadline=NOW + HOUR, now=NOW + HOUR - dt.timedelta(seconds=1))
    assert WaitForJobs().advance(before) == Waiting("waiting for ml/queued, ml/train to finish", retry_in=SOON)  # type: ignore[arg-type]

    at = started(jobs, on_timeout="continue", deadline=NOW + HOUR, now=NOW + HOUR)
    assert WaitForJobs().advance(at) == Done(  # type: ignore[arg-type]
        "time is up; carrying on although ml/queued, ml/train still run (on_timeout: continue)")


def test_at_its_timeout_a_step_not_told_to_continue_keeps_waiting_for_the_engine_to_fail_it(jobs):
    for params in ({}, {"on_timeout": "fail"}):
        ctx = started(jobs, deadline=NOW + HOUR, now=NOW + HOUR, **params)
        outcome = WaitForJobs().advance(ctx)  # type: ignore[arg-type]
        assert outcome == Waiting("waiting for ml/queued, ml/train to finish", retry_in=SOON)
        assert not outcome.overdue_ok  # type: ignore[union-attr]
