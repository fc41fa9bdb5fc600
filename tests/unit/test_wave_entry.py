"""Entering a wave (workflows/engine/waves.py), as the real engine runs plans over the
in-memory cluster, pass by pass, on a clock the test moves (the harness of
test_safety_rules.py and test_wave_course.py).

- As a run enters its next wave, its thread hears which wave of how many starts, on which
  nodes, how many nodes are done and about how long is left at the pace of the waves so
  far; one post per wave (its dedupe key names the run and the wave), and an audit row
  `run.wave` from the wave before to the new one with the same text and the wave's nodes.
- The steps that would have run on a failure of a wave that ended well are skipped as the
  next wave starts, at that moment; those of the wave starting and of later waves are not.
- A step is such a fallback only when its params say `on_failure: true`: any other step
  is the wave's normal work.
- A wave's nodes start together, as many as may be under way, before any of them goes
  on to its next step.
- Waves built with no gate before a node starts run their nodes to the run's end.
"""

from __future__ import annotations

import datetime as dt
import json

from test_safety_rules import NOW, PlannedRun, cluster  # noqa: F401
from test_wave_course import given_back, with_fallback

from storage import audit
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.steps import Step
from workflows.engine.waves import Waves

WAVES = [("gpu-01", "gpu-02"), ("gpu-03", "gpu-04"), ("gpu-05", "gpu-06")]


def current_wave(run: PlannedRun) -> int | None:
    return stored_runs.get(run.db, id=run.run_id).current_wave  # type: ignore[union-attr]


def fallbacks(run: PlannedRun) -> dict[str, Step]:
    """Each node's step that runs only on a failure of its wave (the last of its steps)."""
    return {s.node: s for s in sorted(stored_steps.for_run(run.db, run_id=run.run_id), key=lambda s: s.seq)}


def wave_posts(run: PlannedRun) -> list[tuple[str, str | None, dict[str, object]]]:
    return [(m["kind"], m["dedupe_key"], json.loads(m["payload"]))
            for m in run.db.query("SELECT * FROM outbox ORDER BY id") if '"run.wave"' in m["payload"]]


def test_entering_the_next_wave_is_posted_and_audited_with_where_the_run_stands(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, WAVES, steps=with_fallback)

    run.drive(lambda: current_wave(run) == 2)

    texts = ["wave 1 of 3 started: gpu-01, gpu-02 (0/6 nodes done)",
             "wave 2 of 3 started: gpu-03, gpu-04 (2/6 nodes done; about 2m left at the pace of the waves so far)",
             "wave 3 of 3 started: gpu-05, gpu-06 (4/6 nodes done; about 60s left at the pace of the waves so far)"]
    rows = audit.for_run(db, run.run_id, actions=["run.wave"])
    assert [(r.actor, r.target, r.before, r.after, r.at) for r in rows] == [
        ("gpuops", "train-a", None, 0, NOW), ("gpuops", "train-a", 0, 1, NOW + dt.timedelta(minutes=1)),
        ("gpuops", "train-a", 1, 2, NOW + dt.timedelta(minutes=2))]
    assert [r.detail for r in rows] == [{"nodes": list(nodes), "text": text, "replica": "engine-0", "dry_run": False}
                                        for nodes, text in zip(WAVES, texts)]
    request_id = rows[0].request_id
    assert wave_posts(run) == [
        ("post", f"{run.run_id}/wave/{index}",
         {"event": "run.wave", "request_id": request_id, "run_id": run.run_id, "pool": "train-a", "kind": "drain",
          "state": "running", "text": text, "dry_run": False})
        for index, text in enumerate(texts)]


def test_a_waves_fallbacks_are_skipped_as_the_next_wave_starts_and_those_of_later_waves_wait(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, WAVES, steps=with_fallback)

    run.drive(lambda: current_wave(run) == 1)

    entered = NOW + dt.timedelta(minutes=1)  # wave 2 started then (the audit row above)
    assert {n: (s.kind, s.state, s.ended_at) for n, s in fallbacks(run).items()} == {
        "gpu-01": ("hold", "skipped", entered), "gpu-02": ("hold", "skipped", entered),
        "gpu-03": ("hold", "pending", None), "gpu-04": ("hold", "pending", None),
        "gpu-05": ("hold", "pending", None), "gpu-06": ("hold", "pending", None)}

    run.drive(lambda: current_wave(run) == 2)

    assert {n: (s.state, s.ended_at) for n, s in fallbacks(run).items() if n in ("gpu-03", "gpu-04", "gpu-05")} == {
        "gpu-03": ("skipped", entered + dt.timedelta(minutes=1)),
        "gpu-04": ("skipped", entered + dt.timedelta(minutes=1)), "gpu-05": ("pending", None)}


def test_a_waves_nodes_all_start_in_the_same_pass_as_many_as_may_be_under_way(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05")])

    run.drive(lambda: bool(run.cordoned()))

    assert run.cordoned() == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    moves = [(r.action, r.target) for r in audit.for_run(db, run.run_id) if r.action.startswith("step.")]
    assert moves[:5] == [("step.running", n) for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04")] + [
        ("step.done", "gpu-01")]  # started together, before any of them goes on


def test_a_run_whose_waves_ask_no_gate_before_a_node_starts_goes_to_its_end(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")])
    run.engine._waves = Waves(run.engine, start_step=run.engine.transitions.start)  # no node gate

    run.drive(lambda: run.state() == "succeeded")

    assert run.cordoned() == ["gpu-01", "gpu-02"] and given_back(run) == ["gpu-01", "gpu-02"]
