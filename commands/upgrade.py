"""Driver upgrades: /gpu upgrade <pool> to <version> (request one) and /gpu rollback <run>
(request the version an upgrade run replaced back, for the nodes it changed; for a MIG
run, the layouts it replaced, through commands.mig).

One call to the upgrade use case (`UpgradeService.request`) checks the pool (the one
object that sets its driver version, host drivers, a shared ClusterPolicy or NVIDIADriver,
the version's form, same version, downgrade), plans canary and waves inside the pool's
window (now, `at <time>` or the next window), and stores a pending request bound to the
plan's hash; the reply shows the plan with Approve/Deny. A refusal names the rule and
what to do instead; nothing is stored. `--dry-run` shows the plan and stores nothing. The
upgrade form (bot.upgrade_form) asks through `request_upgrade` with its fields; the Roll
back button on a halted upgrade's card (commands.requests.rollback_intent) asks the same
as `/gpu rollback <run>`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

from commands import messages as msg
from commands.preflight_view import preflight_sections
from commands.drain_grammar import read_start_words, take_include_option
from commands.kinds import ANSWERS, RequestButton, answers, request_button
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import REQUEST_UPGRADE, Fact, Reply, Section, Table, error_reply
from commands.requests import approval_intents
from workflows.access import AccessDenied, Role
from workflows.drain.plan import DrainRequestError
from workflows.engine.runs import UnknownRun
from workflows.kinds import RollsBack, kinds_in_force
from workflows.pools.config import PoolConfig
from workflows.pools.windows import UTC
from workflows.plans import plan_hash
from workflows.requests.errors import RequestRefused
from workflows.requests.views import RequestView
from workflows.upgrade.plan import UpgradeAsk, UpgradePlan
from workflows.upgrade.scope import UpgradeRefused
from workflows.upgrade.service import UpgradeRequested, UpgradeService
from workflows.wording import local_time


def _upgrades(call: Call) -> UpgradeService:
    upgrades = call.services.change("upgrade", UpgradeService)
    if upgrades is None:
        raise NotFoundError(msg.not_available("Requests"))
    return upgrades


def read_upgrade_words(args: list[str], *, pools: Mapping[str, PoolConfig], now: dt.datetime) -> UpgradeAsk:
    """`<pool> to <version> [at <time> | next-window | in the next window] [--downgrade]
    [--also <pool>[,<pool>...]] [reason...]`; a time reads as `/gpu drain`'s does (in the
    pool's zone unless one is named); `--also` names the other pools a shared
    ClusterPolicy moves too. Raises UsageError or DrainRequestError (a time that cannot be
    read)."""
    words, include = take_include_option([w for arg in args for w in arg.split()
                                          if w not in ("--downgrade", "--dry-run")])
    words, also = _take_also(words)
    if len(words) < 3 or words[1] != "to":
        raise UsageError(msg.upgrade_needs_words())
    rest = words[3:]
    policy = pools.get(words[0])
    start, next_window, at = read_start_words(rest, zone=(policy.window_set.zone if policy else None) or UTC,
                                              now=now)
    downgrade = any(w == "--downgrade" for arg in args for w in arg.split())
    return UpgradeAsk(pool=words[0], version=words[2], downgrade=downgrade, reason=" ".join(rest[at:]),
                      start=start, next_window=next_window, also=also, include=include)


def _take_also(words: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """The words without `--also <pools>` (or `--also=<pools>`), and those pools."""
    kept: list[str] = []
    also: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--also" or word.startswith("--also="):
            named = word.partition("=")[2]
            if not named:
                if index + 1 >= len(words):
                    raise UsageError(msg.upgrade_needs_words())
                index += 1
                named = words[index]
            also += [p for p in named.split(",") if p]
        else:
            kept.append(word)
        index += 1
    return kept, tuple(dict.fromkeys(also))


def _reply(call: Call, planned: UpgradePlan, view: RequestView | None = None) -> Reply:
    """The plan as the operator reads it; with the stored request (`view`), its id, who
    asked and the approval buttons, else (a dry run) that nothing was stored."""
    scope = planned.scope
    zone = call.services.config.pools[scope.pool].window_set.zone or call.services.config.display_zone
    end = local_time(planned.window_end, zone) if planned.window_end else None
    facts = (
        Fact("Driver set by", f"{scope.manager.ref} (autoUpgrade {scope.manager.auto_upgrade.state}: "
                              f"{'gpuops gates the operator' if scope.mode == 'gates-operator' else 'gpuops drives'})"),
        Fact("Versions", msg.upgrade_versions(scope.current, scope.target.text)),
        Fact("Window", msg.request_window("upgrade", local_time(planned.window_start, zone), end)),
        Fact("Canary", planned.order.canary),
    )
    fleet_nodes = call.services.fleet.fleet(call.now).nodes
    rows = tuple((str(w.index + 1), ", ".join(w.nodes),
                  str(sum((fleet_nodes[n].physical_gpus or 0) if n in fleet_nodes else 0 for n in w.nodes)))
                 for w in planned.plan.waves)
    waves = Section(title="Waves", table=Table(columns=msg.UPGRADE_WAVE_COLUMNS, rows=rows),
                    bullets=planned.plan.summary.notes)
    if view is None:
        return Reply(title=msg.upgrade_preview_title(scope.pool),
                     summary=msg.upgrade_preview_summary(plan_hash(planned.plan)[:8]),
                     sections=(Section(facts=facts), waves, *preflight_sections(planned.plan.summary)))
    sections = (
        Section(facts=facts), waves, *preflight_sections(planned.plan.summary),
        Section(facts=(Fact("Request", view.id), Fact("Requested by", view.requester_name),
                       Fact("Reason", view.reason or "-"), Fact("Plan hash", view.plan_hash))),
    )
    return Reply(title=msg.upgrade_title(view.id, view.pool),
                 summary=msg.drain_summary(view.state, view.approvals_counted, view.approvals_required,
                                           view.short_hash),
                 sections=sections, intents=approval_intents(view, call.actor))


request_button(RequestButton(kind="upgrade", action=REQUEST_UPGRADE, label=msg.request_upgrade_label()))

@REGISTRY.command("upgrade", usage=msg.UPGRADE_USAGE, role=Role.OPERATOR,
                  summary="Ask for a pool's driver upgrade: canary, then waves, after approvals",
                  examples=("/gpu upgrade serving-a to 580.105.08 security fix",))
def upgrade(call: Call, args: list[str]) -> Reply:
    try:
        ask = read_upgrade_words(args, pools=call.services.config.pools, now=call.now)
    except DrainRequestError as err:
        return error_reply(msg.upgrade_refused_title(err.code), str(err))
    if any(w == "--dry-run" for arg in args for w in arg.split()):
        fleet = call.services.fleet.fleet(call.now)
        try:
            return _reply(call, _upgrades(call).preview(call.actor, ask, fleet=fleet, now=call.now))
        except UpgradeRefused as err:
            return error_reply(msg.upgrade_refused_title(err.code), err.reason)
    return request_upgrade(call, ask)


def preview_upgrade(call: Call, args: list[str]) -> Reply:
    """`gpuops upgrade ... --dry-run`: the plan `/gpu upgrade` would ask approval for, with
    the same words and options, for whoever may read the fleet (nothing is stored, so the
    operator role it takes to ask is not needed to look)."""
    try:
        ask = read_upgrade_words(args, pools=call.services.config.pools, now=call.now)
        planned = _upgrades(call).preview(call.actor, ask, fleet=call.services.fleet.fleet(call.now), now=call.now,
                                          reader=True)
    except DrainRequestError as err:
        return error_reply(msg.upgrade_refused_title(err.code), str(err))
    except UpgradeRefused as err:
        return error_reply(msg.upgrade_refused_title(err.code), err.reason)
    except UsageError as err:
        return error_reply(msg.usage_title(msg.UPGRADE_USAGE), str(err))
    except (NotFoundError, AccessDenied) as err:
        return error_reply(msg.refused_title(), str(err))
    return _reply(call, planned)


def request_upgrade(call: Call, ask: UpgradeAsk) -> Reply:
    """Plan, check and store the upgrade `ask` describes, and the reply showing it: what
    `/gpu upgrade` does after reading its words, and what the upgrade form does with its
    fields."""
    fleet = call.services.fleet.fleet(call.now)
    return _answer(call, lambda: _upgrades(call).request(call.actor, ask, fleet=fleet, now=call.now,
                                                          channel=call.channel))


@REGISTRY.command("rollback", usage="rollback <run>", role=Role.OPERATOR,
                  summary="Ask to put back what an upgrade, MIG change or move to the operator changed",
                  examples=("/gpu rollback run-4b1d9e",))
def rollback(call: Call, args: list[str]) -> Reply:
    if len(args) != 1:
        raise UsageError(msg.name_one("upgrade run, e.g. `/gpu rollback run-4b1d9e`"))
    return rollback_run(call, args[0])


def rollback_run(call: Call, run_id: str) -> Reply:
    """`/gpu rollback <run>` with its run read: ask to put back what the run changed."""
    if call.services.runs is None:
        raise NotFoundError(msg.not_available("Runs"))
    try:
        run = call.services.runs.get(run_id)
    except UnknownRun as err:
        raise NotFoundError(str(err)) from None
    fleet = call.services.fleet.fleet(call.now)
    # The run's kind rolls itself back (workflows/kinds.py says which kinds can); any other
    # run is the driver upgrade service's to refuse, saying it is not an upgrade.
    kind = kinds_in_force().get(run.kind)
    found = call.services.changes.get(run.kind) if kind is not None and kind.rollback else None
    own = found if isinstance(found, RollsBack) else None
    answer = ANSWERS.get(run.kind) if own is not None else None
    service: RollsBack
    if own is None or answer is None:
        service, answer = _upgrades(call), _answer
    else:
        service = own
    return answer(call, lambda: service.rollback(call.actor, run, fleet=fleet, now=call.now, channel=call.channel))


@answers("upgrade")
def _answer(call: Call, planned: Callable[[], UpgradeRequested]) -> Reply:
    try:
        done = planned()
    except UpgradeRefused as err:
        return error_reply(msg.upgrade_refused_title(err.code), err.reason)
    except AccessDenied:
        raise
    except RequestRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return _reply(call, done.planned, done.view)
