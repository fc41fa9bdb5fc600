"""Continuing a halted run (`/gpu continue <run> [--skip <node>]`), for any kind of change.

A halted run is `failed` with its steps as they were. Asking again would plan every node
anew (nodes already changed included, cordoned and evicted again). A continuation is a
new request of the same kind and pool whose plan is what remains of the halted run's:

- nodes whose steps are all done are not in it; nodes the run left out (a PDB at its
  timeout, the pool saying `skip`) neither: the run would have finished without them;
- a node the run stopped on (or that was under way when it stopped) starts with a cordon
  that takes over the halted run's mark (so the continuation gives it back when done)
  and then repeats only the steps from its first one not done: it stayed cordoned, so
  what the earlier steps did still holds (a driver already at the version is left as it
  is). A node a person uncordoned since repeats everything from its cordon on;
- nodes the run never reached get every step, as planned;
- with `--skip <node>`, that node is left out, and left cordoned for a person if the
  halted run holds it (the plan and the thread say so).

Waves keep their order, the node the run stopped on first. The rest is checked against
the pool as it is now: the window (the halted request's, while it lasts, else the pool's
next), each wave's capacity (nodes the continuation gives back before count as back in
service) and, when it is stored, a change freeze (`RequestService.submit`). It is stored
under the pool's approval rule for its kind, as the halted request was, with its own
plan hash; every node's first step carries the mark `continues: <run>` (`ContinuesMark`), so a second
continuation of that run, or a rollback of it while this one is open, is refused."""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from storage.step_params import ContinuesMark, TakesOverMark
from storage.steps import Step
from workflows.access import Actor, Role, require
from workflows.engine import continue_messages as say
from workflows.engine.waves import LEFT_OUT
from workflows.engine.runs import RunView
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools.capacity import check_drain, concurrent_work, pool_nodes
from workflows.pools.config import PoolConfig
from workflows.pools.starts import WindowRefused, start_window
from workflows.pools.windows import WindowSet
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

Progress = Literal["done", "left-out", "held", "started", "untouched"]


class ContinueRefused(Exception):
    """The run cannot be continued; `reason` is one sentence for the person who asked."""

    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class NodeRemains:
    """What is left of one node of the halted run: its `progress`, and the plan's steps
    the continuation runs for it (`repeats_from`: the first one not done, by kind)."""

    node: NodeName
    wave: int
    progress: Progress
    steps: tuple[NodeStep, ...]
    halted_here: bool = False
    repeats_from: str | None = None


@dataclass(frozen=True, slots=True)
class Continued:
    plan: Plan
    view: RequestView
    run: str
    done: tuple[str, ...]
    retried: tuple[str, ...]
    skipped: str | None


class ContinueService:
    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig]) -> None:
        self._requests = requests
        self._pools = pools

    def request(self, actor: Actor, run: RunView, *, fleet: Fleet, now: dt.datetime, skip: str | None = None,
                channel: str | None = None) -> Continued:
        """Plan what remains of the halted `run` (without `skip`), check it against the
        pool now and store it as a request. Raises ContinueRefused, AccessDenied or
        RequestRefused (a freeze, the pool's rules for requests)."""
        require(actor, Role.OPERATOR, action="Continuing a halted run", pool=run.pool)
        if run.run.dry_run:
            raise ContinueRefused(say.continue_dry_run(run.id), code="dry-run")
        if run.state != "failed":
            raise ContinueRefused(say.continue_not_halted(run.id, run.state), code="not-halted")
        policy = self._pools.get(run.pool)
        if policy is None:
            raise ContinueRefused(say.continue_pool_not_configured(run.id, run.pool), code="pool-not-configured")
        earlier = self._requests.continuation_of(run.id, pool=run.pool)
        if earlier is not None:
            raise ContinueRefused(say.continue_already(run.id, earlier.id, earlier.state), code="already-continued")
        rollback = self._requests.rollback_asked(run.id, pool=run.pool)
        if rollback is not None:
            raise ContinueRefused(say.continue_while_rollback(run.id, rollback.id), code="rollback-asked")
        halted = self._requests.get(run.request_id)
        remains = what_remains(halted.plan, run.steps, fleet=fleet)
        if skip is not None:
            _check_skip(skip, run=run, remains=remains, fleet=fleet)
        left = [r for r in remains if r.steps and r.node != skip]
        if not left:
            raise ContinueRefused(say.continue_nothing_left(run.id, skipped=skip), code="nothing-left")
        start, end = continuation_window(halted.window_start, halted.window_end, policy.window_set,
                                         pool=run.pool, now=now)
        waves = _waves(left, run_id=run.id)
        set_again = version_to_set_again(halted.plan, run.steps)
        if set_again is not None:
            waves = _setting_version_again(waves, *set_again)
        self._check_capacity(run, waves, fleet=fleet, policy=policy, start=start, end=end)
        skipped = fleet.nodes.get(NodeName(skip)) if skip is not None else None
        skipped_cordoned = skipped is not None and skipped.cordoned and skipped.cordon_run == run.id
        plan = Plan(kind=halted.plan.kind, pool=run.pool, waves=waves, created_for=actor.user_id,
                    summary=PlanSummary(
                        target_driver_version=halted.summary.target_driver_version,
                        target_mig_config=halted.summary.target_mig_config,
                        window_start=start, window_end=end,
                        evictions_expected=sum(1 for r in left if any(s.kind in ("evict", "drain") for s in r.steps)
                                               and fleet.nodes.get(r.node) is not None
                                               and fleet.nodes[r.node].requested_gpus),
                        max_gpus_unavailable=max(sum(_gpus(fleet, n) for n in w.nodes) for w in waves),
                        notes=_notes(run.id, remains, left, skip, skipped_cordoned=skipped_cordoned)
                        + ((say.continue_sets_version_again_note(run.id, str(set_again[0].params.get("version"))),)
                           if set_again is not None else ())))
        view = self._requests.submit(actor, kind=halted.kind, pool=run.pool, targets=list(plan.nodes), plan=plan,
                                     window_start=start, window_end=end,
                                     reason=say.continue_reason(run.id, halted.reason, skipped=skip,
                                                                 cordoned=skipped_cordoned), channel=channel, now=now)
        return Continued(plan=plan, view=view, run=run.id,
                         done=tuple(r.node for r in remains if r.progress == "done"),
                         retried=tuple(r.node for r in left if r.progress in ("held", "started")), skipped=skip)

    def _check_capacity(self, run: RunView, waves: Sequence[Wave], *, fleet: Fleet, policy: PoolConfig,
                        start: dt.datetime, end: dt.datetime | None) -> None:
        """Each wave against the pool as it is now, as the engine checks it before the wave
        starts: nodes of earlier waves, which this continuation gives back, count as back."""
        members = pool_nodes(fleet, run.pool)
        concurrent = concurrent_work(self._requests.open_requests(run.pool), pool=run.pool)
        given_back: set[str] = set()
        for wave in waves:
            now_pool = [dataclasses.replace(n, cordoned=False)
                        if n.name in given_back and n.cordon_run == run.id else n for n in members]
            verdict = check_drain(pool=run.pool, pool_nodes=now_pool, nodes=wave.nodes, start=start, end=end,
                                  max_unavailable=policy.unavailable_budget, min_ready_gpus=policy.min_ready_gpus,
                                  concurrent=concurrent)
            if not verdict.ok:
                raise ContinueRefused(say.continue_does_not_fit(run.id, wave.index, wave.nodes,
                                                                verdict.refusals[0].reason),
                                      code=verdict.refusals[0].rule)
            given_back.update(wave.nodes)


def what_remains(plan: Plan, steps: Sequence[Step], *, fleet: Fleet) -> list[NodeRemains]:
    """Every node of the halted run's `plan`, in plan order, with the plan's steps a
    continuation runs for it (none for a node done or left out)."""
    remains: list[NodeRemains] = []
    for wave in plan.waves:
        for node in wave.nodes:
            planned = wave.steps_for(node)
            ran = {s.seq: s for s in steps if s.node == node and s.wave == wave.index}
            remains.append(_node_remains(node, wave.index, planned, ran, fleet.nodes.get(node)))
    return remains


def _node_remains(node: NodeName, wave: int, planned: Sequence[NodeStep], ran: Mapping[int, Step],
                  inventory: NodeInventory | None) -> NodeRemains:
    # A step that runs only on a failure (a failed canary's set-back) is no part of what
    # the node still has to do: its wave ended well (skipped) or it ran when the run
    # halted; `version_to_set_again` decides what a continuation needs of it.
    states = ["done" if planned[seq].params.get("on_failure") else ran[seq].state if seq in ran else "pending"
              for seq in range(len(planned))]
    halted_here = any(ran[seq].state == "failed" for seq in ran)
    if all(state == "done" for state in states):
        return NodeRemains(node, wave, "done", ())
    if any(_left_out(s) for s in ran.values()):
        return NodeRemains(node, wave, "left-out", ())
    first = next(seq for seq, state in enumerate(states) if state != "done")
    if first == 0:
        return NodeRemains(node, wave, "untouched", _taking_over(planned, ran), halted_here)
    cordon = next((seq for seq, step in enumerate(planned) if step.kind == "cordon"), None)
    held = cordon is not None and cordon < first and not (inventory is not None and not inventory.cordoned)
    if cordon is not None and cordon < first and not held:
        # A person gave the node back since: what the steps after its cordon did may not
        # hold any more (pods may have landed), so the node goes through them again.
        first = cordon
    again = [planned[seq] for seq in range(first, len(planned)) if not planned[seq].params.get("on_failure")]
    if held and cordon is not None:  # held: the cordon step ran
        again.insert(0, planned[cordon])
    hold = next((s for s in planned[:first] if s.kind == "operator-hold" and not s.params.get("release")), None)
    if hold is not None and planned[first].kind == "driver-version" and planned[first].params.get("git"):
        # A run that ended waiting for Git gave back the nodes it held (none had moved):
        # they are held again before the continuation waits for Git.
        again.insert(0, hold)
    return NodeRemains(node, wave, "held" if held else "started", _taking_over(again, ran), halted_here,
                       repeats_from=planned[first].kind)


def _taking_over(steps: Sequence[NodeStep], ran: Mapping[int, Step]) -> tuple[NodeStep, ...]:
    """The steps with each cordon taking over what the halted run left (its mark, with its
    record of the node before), so the continuation gives the node back as it was then."""
    run_id = next((s.run_id for s in ran.values()), None)
    if run_id is None:
        return tuple(steps)
    return tuple(NodeStep(s.kind, s.node, TakesOverMark(takes_over=run_id).written_into(s.params))
                 if s.kind == "cordon" else s for s in steps)


def _left_out(step: Step) -> bool:
    detail = step.detail if isinstance(step.detail, dict) else {}
    result = detail.get("result")
    return step.state == "skipped" and isinstance(result, dict) and bool(result.get(LEFT_OUT))


def _check_skip(skip: str, *, run: RunView, remains: Sequence[NodeRemains], fleet: Fleet) -> None:
    found = next((r for r in remains if r.node == skip), None)
    if found is None:
        in_run = [r.node for r in remains]
        if skip not in fleet.nodes:
            closest = difflib.get_close_matches(skip, [*in_run, *fleet.nodes], n=3, cutoff=0.6)
            raise ContinueRefused(say.continue_skip_unknown_node(skip, closest), code="unknown-node")
        raise ContinueRefused(say.continue_skip_not_in_run(skip, run.id, in_run), code="node-not-in-run")
    if not found.steps:
        raise ContinueRefused(say.continue_skip_nothing_left(skip, run.id, found.progress), code="node-finished")


def _waves(left: Sequence[NodeRemains], *, run_id: str) -> tuple[Wave, ...]:
    """The halted run's waves with the nodes that remain, renumbered; in each, the node the
    run stopped on first; every node's first step marked as continuing `run_id`."""
    waves: list[Wave] = []
    for index in sorted({r.wave for r in left}):
        nodes = sorted((r for r in left if r.wave == index), key=lambda r: not r.halted_here)
        # A continuation of a continuation names only the run it continues.
        steps = [NodeStep(s.kind, s.node, ContinuesMark(continues=run_id).written_into(ContinuesMark.left_out_of(s.params))
                          if i == 0 else ContinuesMark.left_out_of(s.params))
                 for r in nodes for i, s in enumerate(r.steps)]
        waves.append(Wave(len(waves), tuple(r.node for r in nodes), tuple(steps)))
    return tuple(waves)


def version_to_set_again(plan: Plan, steps: Sequence[Step]) -> tuple[NodeStep, NodeStep] | None:
    """After a failed canary whose run set its driver object back (the `driver-version`
    step with `set_back`, done with what it changed), the rest of the upgrade needs the
    object at the new version again: the halted plan's forward step and its set-back, for
    the continuation's first wave. None when the run did not set it back (a Git-kept object
    is left for Git: the step only said what to set back there)."""
    forward = next((s for w in plan.waves for s in w.steps
                    if s.kind == "driver-version" and not s.params.get("set_back")), None)
    back = next((s for w in plan.waves for s in w.steps
                 if s.kind == "driver-version" and s.params.get("set_back")), None)
    if forward is None or back is None:
        return None
    for step in steps:
        detail = step.detail if isinstance(step.detail, dict) else {}
        params = found if isinstance(found := detail.get("params"), dict) else {}
        result = detail.get("result")
        if (step.kind == "driver-version" and params.get("set_back") and step.state == "done"
                and isinstance(result, dict) and "to" in result and not result.get("git")):
            return forward, back
    return None


def _setting_version_again(waves: Sequence[Wave], forward: NodeStep, back: NodeStep) -> tuple[Wave, ...]:
    """The continuation's first wave starts by setting the version again (on its first
    node, before anything else) and sets it back if that wave fails, as a canary wave
    does; a set-back step it already carries is not repeated."""
    first = waves[0]
    node = first.nodes[0]
    steps = [s for s in first.steps if not (s.kind == "driver-version" and s.params.get("set_back"))]
    continued = ContinuesMark.read_from(first.steps[0].params, kind=first.steps[0].kind)
    mark = TakesOverMark.left_out_of(forward.params)
    if continued is not None:
        mark = continued.written_into(mark)
    steps = [NodeStep(forward.kind, node, mark), *steps, NodeStep(back.kind, node, dict(back.params))]
    return (Wave(first.index, first.nodes, tuple(steps)), *waves[1:])


def continuation_window(start: dt.datetime | None, end: dt.datetime | None, windows: WindowSet, *, pool: str,
                        now: dt.datetime) -> tuple[dt.datetime, dt.datetime | None]:
    """The halted request's window while it lasts (from now), else the pool's next one;
    a pool open at any time keeps the halted request's length of window, from now."""
    if end is None or now < end:
        return max(now, start or now), end
    try:
        begins, ends = start_window(windows, pool=pool, now=now, what="continuation")
    except WindowRefused as refused:
        raise ContinueRefused(refused.reason, code=refused.code) from None
    if ends is None and start is not None:
        ends = begins + (end - start)
    return begins, ends


def _gpus(fleet: Fleet, node: str) -> int:
    found = fleet.nodes.get(NodeName(node))
    return (found.physical_gpus or 0) if found is not None else 0


def _notes(run_id: str, remains: Sequence[NodeRemains], left: Sequence[NodeRemains], skipped: str | None,
           *, skipped_cordoned: bool) -> tuple[str, ...]:
    notes = [say.continue_plan_note(run_id, [r.node for r in left])]
    done = [r.node for r in remains if r.progress == "done"]
    if done:
        notes.append(say.continue_done_note(run_id, done))
    for r in left:
        if r.repeats_from is not None:
            notes.append(say.continue_repeats_note(r.node, r.repeats_from, held=r.progress == "held"))
    left_out = [r.node for r in remains if r.progress == "left-out"]
    if left_out:
        notes.append(say.continue_left_out_note(run_id, left_out))
    if skipped is not None:
        notes.append(say.continue_skipped_note(skipped, run_id, cordoned=skipped_cordoned))
    return tuple(notes)
