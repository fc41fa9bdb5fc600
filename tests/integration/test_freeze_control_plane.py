"""Change freezes against the real control plane and the real engine: a run in flight
stops at its next node boundary (the node under way finishes every step, uncordon
included; the next node is never cordoned) and goes on by itself when an admin lifts the
freeze; a freeze that lets running runs finish lets it finish; a run queued before a
freeze does not start until it ends; a run a freeze holds past its window's end halts
with that reason and touches no further node. The thread hears each, and the audit log
has them all."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from bot.home import home_view
from commands.catalog import dispatch
from commands.messages import WAITS_LABEL
from commands.reply import Reply
from commands.requests import open_waits
from commands.services import Services
from storage import audit
from storage.database import Database
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunRefused, RunService, RunView
from workflows.plans import Plan
from workflows.requests.errors import RequestRefused
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView


CHANNEL = "C0GPUOPS"
POOL = "frz"
# cordon, hold (until `drain done`, or with a window until its end), uncordon.
HELD = (("cordon", {}), ("hold", {"until": None}), ("uncordon", {}))
HELD_TO_WINDOW = (("cordon", {}), ("hold", {}), ("uncordon", {}))
CONFIG = GpuopsConfig.model_validate({
    "pools": {POOL: {"kind": "training", "windows": "always", "approvals": h.NO_APPROVALS}},
    "access": {"users": {"U0ALICE": ["operator"], "U0ERIN": ["admin"]}, "names": {"U0ALICE": "alice", "U0ERIN": "erin"}},
})
ALICE = CONFIG.actor("U0ALICE")


class NoFleet:
    def fleet(self, now: dt.datetime) -> Any:
        raise AssertionError("freezes and runs do not read the fleet")


@pytest.fixture
def frz(fleet, cluster) -> Any:
    fleet(fl.FleetSpec(name=POOL, system_nodes=0, pools=(fl.PoolSpec(name=POOL, kind="training", nodes=3),)))
    installer = cluster.installer()
    names = [f"{POOL}-0{n}" for n in (1, 2, 3)]
    wait_until(lambda: all(advertised(h.node(installer, n)) > 0 for n in names), timeout=60,
               what="the frz nodes to advertise their GPUs")
    return installer


def gpu(db: Database, who: str, text: str) -> Reply:
    services = Services.on_database(config=CONFIG, fleet=NoFleet(), database=db)
    return dispatch(text, actor=CONFIG.actor(who), services=services, now=h.now(), channel=CHANNEL)


def submit(db: Database, waves: list[list[str]], steps=HELD,
           window: tuple[dt.datetime | None, dt.datetime | None] = (None, None)) -> RequestView:
    plan: Plan = h.plan("drain", POOL, waves, steps)
    request = RequestService(db, CONFIG).submit(ALICE, kind="drain", pool=POOL, targets=list(plan.nodes), plan=plan,
                                                window_start=window[0], window_end=window[1], reason="freeze test",
                                                channel=CHANNEL, now=h.now())
    assert request.state == "approved"
    return request


def start(db: Database, request: RequestView) -> RunView:
    return RunService(db).start(request.id, dry_run=False, now=h.now(), actor=ALICE)


def step_state(db: Database, run_id: str, node: str, kind: str) -> str:
    return next(s.state for s in RunService(db).get(run_id).steps if (s.node, s.kind) == (node, kind))


def freeze(db: Database, words: str, *, minutes: int = 30) -> Reply:
    until = (h.now() + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M")
    reply = gpu(db, "U0ERIN", f"/gpu freeze {POOL} until {until} UTC {words}")
    assert reply.ok, reply.summary
    return reply


def actions(db: Database, run_id: str) -> list[str]:
    return [e.action for e in audit.for_run(db, run_id)]


def thread(db: Database) -> list[str]:
    return [str(json.loads(r["payload"])["text"]) for r in db.query("SELECT payload FROM outbox ORDER BY id")]


def test_a_run_in_flight_stops_at_the_next_node_boundary_and_goes_on_when_the_freeze_is_lifted(frz, cluster, db):
    request = submit(db, [[f"{POOL}-01"], [f"{POOL}-02"]])
    run = start(db, request)
    with h.EngineThread(cluster.kubeconfig, db.path) as engine:
        wait_until(lambda: step_state(db, run.id, f"{POOL}-01", "hold") == "running", timeout=60,
                   what="frz-01 to be held")
        frozen = freeze(db, "incident 4711")
        assert frozen.sections[0].bullets == (f"Runs in flight that stop at their next node boundary, then wait: {run.id}",)
        # The node under way finishes every step, its uncordon too.
        RunService(db).release_hold(ALICE, request.id, now=h.now())
        wait_until(lambda: step_state(db, run.id, f"{POOL}-01", "uncordon") == "done", timeout=60,
                   what="frz-01 to be given back")
        engine.passes_after(10)
        # ...and the next node is not touched while the freeze is in force.
        steps = RunService(db).get(run.id)
        assert steps.state == "running"
        assert {s.state for s in steps.steps if s.node == f"{POOL}-02"} == {"pending"}
        assert not h.unschedulable(frz, f"{POOL}-01") and not h.unschedulable(frz, f"{POOL}-02")
        said = [t for t in thread(db) if t.startswith(f"Run {run.id} stops at the next node boundary")]
        assert len(said) == 1, thread(db)
        # Why it waits, in one sentence: on the request view and on App Home alike.
        shown = gpu(db, "U0ALICE", f"/gpu request {request.id}")
        (why,) = [f.value for f in shown.sections[0].facts if f.label == WAITS_LABEL]
        assert why.startswith(f"Waits for the freeze of pool {POOL} (by erin until "), why
        assert why.endswith(": incident 4711) to end; it goes on by itself then."), why
        services = Services.on_database(config=CONFIG, fleet=NoFleet(), database=db)
        home = str(home_view(Reply(title="GPU fleet status"), [], now=h.now(),
                             waits=open_waits(services, now=h.now())))
        assert f"*{request.id}* · Drain on {POOL}: {why}" in home, home
        assert f"pool {POOL} is frozen by erin until" in said[0] and "(incident 4711)" in said[0]
        assert "goes on by itself" in said[0]
        # New requests are refused meanwhile, saying by whom and why.
        with pytest.raises(RequestRefused, match=r"No new drain request for frz: pool frz is frozen by erin until .*"
                                                 r"\(incident 4711\)"):
            submit(db, [[f"{POOL}-03"]])

        lifted = gpu(db, "U0ERIN", f"/gpu unfreeze {POOL} incident closed")
        assert lifted.ok, lifted.summary
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert not h.unschedulable(frz, f"{POOL}-02") and h.cordon_mark(frz, f"{POOL}-02") is None
    done = [(e.target, e.detail["kind"]) for e in audit.for_run(db, run.id) if e.action == "step.done"]
    assert done == [(f"{POOL}-01", "cordon"), (f"{POOL}-01", "hold"), (f"{POOL}-01", "uncordon"),
                    (f"{POOL}-02", "cordon"), (f"{POOL}-02", "hold"), (f"{POOL}-02", "uncordon")]
    seen = actions(db, run.id)
    assert seen.count("run.frozen") >= 1 and seen.count("run.unfrozen") == 1
    # Frozen only after frz-01's hold began, going on only before frz-02's cordon started.
    assert seen.index("run.unfrozen") < [i for i, a in enumerate(seen) if a == "step.running"][3]
    assert any(t == f"The freeze of pool {POOL} is over: run {run.id} goes on from the node where it stopped."
               for t in thread(db))
    assert [e.action for e in audit.recent(db, 200) if e.action.startswith("freeze.")] == ["freeze.lifted", "freeze.set"]
    assert audit.verify(db).ok


def test_a_freeze_that_lets_running_runs_finish_lets_them_finish_but_starts_no_new_run(frz, cluster, db):
    request = submit(db, [[f"{POOL}-01"], [f"{POOL}-02"]])
    waiting = submit(db, [[f"{POOL}-03"]])  # approved before the freeze, not started
    run = start(db, request)
    with h.EngineThread(cluster.kubeconfig, db.path):
        wait_until(lambda: step_state(db, run.id, f"{POOL}-01", "hold") == "running", timeout=60,
                   what="frz-01 to be held")
        reply = freeze(db, "--let-running-finish launch day")
        assert f"Approved requests that do not start while it is in force: {waiting.id}" in reply.sections[0].bullets
        RunService(db).release_hold(ALICE, request.id, now=h.now())
        finished = h.wait_run(db, run.id)
        with pytest.raises(RunRefused, match=f"The run of {waiting.id} does not start: pool frz is frozen by erin"):
            start(db, waiting)

    assert finished.state == "succeeded", finished.halted_reason
    assert "run.frozen" not in actions(db, run.id)
    assert RequestService(db, CONFIG).get(waiting.id).state == "approved"
    assert not h.unschedulable(frz, f"{POOL}-03")


def test_a_run_queued_before_a_freeze_starts_only_when_the_freeze_ends(frz, cluster, db):
    request = submit(db, [[f"{POOL}-01"]], steps=(("cordon", {}), ("uncordon", {})))
    run = start(db, request)  # queued; no engine looks at it yet
    freeze(db, "--let-running-finish DC maintenance")  # it had not started: the freeze holds it
    with h.EngineThread(cluster.kubeconfig, db.path) as engine:
        engine.passes_after(10)
        assert RunService(db).get(run.id).state == "pending"
        assert not h.unschedulable(frz, f"{POOL}-01")
        assert actions(db, run.id) == ["run.created", "run.frozen"]
        assert gpu(db, "U0ERIN", f"/gpu unfreeze {POOL}").ok
        finished = h.wait_run(db, run.id)
    assert finished.state == "succeeded", finished.halted_reason
    assert actions(db, run.id)[:4] == ["run.created", "run.frozen", "run.unfrozen", "run.started"]


def test_a_run_held_by_a_freeze_past_its_windows_end_halts_and_touches_no_further_node(frz, cluster, db):
    start_at = h.now() - dt.timedelta(seconds=5)
    request = submit(db, [[f"{POOL}-01"], [f"{POOL}-02"]], steps=HELD_TO_WINDOW,
                     window=(start_at, h.now() + dt.timedelta(seconds=20)))
    run = start(db, request)
    with h.EngineThread(cluster.kubeconfig, db.path):
        wait_until(lambda: step_state(db, run.id, f"{POOL}-01", "hold") == "running", timeout=60,
                   what="frz-01 to be held")
        freeze(db, "incident 4712")
        halted = h.wait_run(db, run.id, timeout=90)

    assert halted.state == "failed"
    assert halted.halted_reason is not None and "while pool frz was frozen" in halted.halted_reason
    assert step_state(db, run.id, f"{POOL}-01", "uncordon") == "done"
    assert not h.unschedulable(frz, f"{POOL}-01")
    assert not any(e.target == f"{POOL}-02" for e in audit.for_run(db, run.id) if e.action == "step.running")
    assert not h.unschedulable(frz, f"{POOL}-02")


def test_an_engine_restarted_during_a_freeze_neither_tells_it_again_nor_forgets_to_say_the_run_goes_on(
        frz, cluster, db):
    request = submit(db, [[f"{POOL}-01"]], steps=(("cordon", {}), ("uncordon", {})))
    run = start(db, request)
    freeze(db, "DC maintenance")
    with h.EngineThread(cluster.kubeconfig, db.path):
        wait_until(lambda: "run.frozen" in actions(db, run.id), timeout=60, what="the run to be told of the freeze")
    with h.EngineThread(cluster.kubeconfig, db.path) as engine:  # a new process, nothing remembered
        engine.passes_after(10)
        assert actions(db, run.id) == ["run.created", "run.frozen"]
        assert gpu(db, "U0ERIN", f"/gpu unfreeze {POOL}").ok
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert actions(db, run.id)[:4] == ["run.created", "run.frozen", "run.unfrozen", "run.started"]
    assert len([t for t in thread(db) if t.startswith(f"The freeze of pool {POOL} is over: run {run.id}")]) == 1
