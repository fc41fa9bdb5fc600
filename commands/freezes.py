"""Change freezes: /gpu freeze (admins), /gpu unfreeze (admins) and /gpu freezes.

`/gpu freeze <pool|cluster> until <time> [--let-running-finish] [reason]` reads its time
with the drain grammar's time reader (`commands.drain_grammar.read_time`: a date and
time, a day and time, today/tomorrow, a bare clock time, an optional zone; without a
zone the pool's window zone, else UTC). A time that is not after now, a time that cannot
be read, an unknown pool or an unknown option each get their own sentence and change
nothing. What a freeze does is in `workflows.pools.freezes`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from commands import messages as msg
from commands import freeze_messages as freeze_msg
from commands.drain_grammar import read_time, take_time_words
from commands.registry import REGISTRY, Call, NotFoundError, UsageError
from commands.reply import Fact, Reply, Section, Table, error_reply
from workflows.access import AccessDenied, Role
from workflows.drain.plan import DrainRequestError
from workflows.pools.config import PoolConfig
from workflows.pools.freezes import CLUSTER, Freeze, FreezeRefused, FreezeService, freeze_sentence
from workflows.pools.windows import UTC
from workflows.wording import when


@dataclass(frozen=True, slots=True)
class FreezeAsk:
    """A freeze as a person asked for it: the target as typed, the end, the reason."""

    target: str
    until: dt.datetime
    reason: str
    let_running_finish: bool


def read_freeze_words(args: Sequence[str], *, pools: dict[str, PoolConfig], now: dt.datetime) -> FreezeAsk:
    """The words after `/gpu freeze` as a `FreezeAsk`; UsageError saying which word is
    wrong. The target is checked by the freeze service (it knows the pools)."""
    words = [word for arg in args for word in arg.split()]
    flags = [w for w in words if w.startswith("--")]
    for flag in flags:
        if flag.lower() != freeze_msg.FREEZE_FLAG:
            raise UsageError(freeze_msg.freeze_unknown_flag(flag))
    words = [w for w in words if not w.startswith("--")]
    if not words:
        raise UsageError(freeze_msg.freeze_needs_target())
    target = words[0]
    if len(words) < 2 or words[1].lower() != "until":
        raise UsageError(freeze_msg.freeze_needs_until(words[1] if len(words) > 1 else None))
    pool = pools.get(target)
    zone = (pool.window_set.zone if pool is not None else None) or UTC
    try:
        when_words, at = take_time_words(words, 2)
        until, _ = read_time(when_words, zone=zone, now=now)
    except DrainRequestError as err:
        if err.code == "bad-time":
            raise UsageError(freeze_msg.freeze_bad_time(" ".join(words[2:4]))) from None
        raise UsageError(err.reason) from None
    return FreezeAsk(target=target, until=until, reason=" ".join(words[at:]).strip(),
                     let_running_finish=bool(flags))


def _freezes(call: Call) -> FreezeService:
    if call.services.freezes is None:
        raise NotFoundError(msg.not_available("Freezes"))
    return call.services.freezes


def _covered(call: Call, freeze: Freeze) -> tuple[list[str], list[str]]:
    """The runs in flight and the approved requests of the pools `freeze` covers."""
    runs = [str(r.id) for r in (call.services.runs.unfinished() if call.services.runs else ())
            if freeze.target in (CLUSTER, r.pool)]
    waiting = [str(v.id) for v in (call.services.requests.open_requests() if call.services.requests else ())
               if v.state in ("approved", "scheduled") and freeze.target in (CLUSTER, v.pool)]
    return runs, waiting


@REGISTRY.command("freeze", usage=freeze_msg.FREEZE_USAGE, role=Role.ADMIN,
                  summary="Freeze changes to a pool or the cluster until a time: no new requests, no run starts",
                  examples=("/gpu freeze serving-a until tomorrow 09:00 incident 4711",
                            f"/gpu freeze cluster until 2026-12-28 08:00 Europe/Berlin {freeze_msg.FREEZE_FLAG} holidays"))
def freeze(call: Call, args: list[str]) -> Reply:
    service = _freezes(call)
    ask = read_freeze_words(args, pools=call.services.config.pools, now=call.now)
    try:
        service.check_target(ask.target)
        done = service.set(call.actor, target=ask.target, until=ask.until, reason=ask.reason,
                           let_running_finish=ask.let_running_finish, now=call.now)
    except FreezeRefused as err:
        return error_reply(msg.refused_title(), str(err))
    except AccessDenied:
        raise
    frozen = done.freeze
    zone = call.services.config.display_zone
    runs, waiting = _covered(call, frozen)
    bullets = []
    if done.replaced is not None:
        bullets.append(freeze_msg.freeze_replaced(freeze_sentence(done.replaced, zone=zone)))
    if runs:
        bullets.append(freeze_msg.freeze_held_runs(runs, let_running_finish=frozen.let_running_finish))
    if waiting:
        bullets.append(freeze_msg.freeze_held_requests(waiting))
    facts = (Fact("Until", when(frozen.until, zone)), Fact("Reason", frozen.reason or "-"),
             Fact("Runs in flight", "finish" if frozen.let_running_finish else "stop at their next node boundary"))
    return Reply(title=freeze_msg.frozen_title(frozen.target), summary=freeze_sentence(frozen, zone=zone), visibility="in_channel",
                 sections=(Section(facts=facts, bullets=tuple(bullets)),))


@REGISTRY.command("unfreeze", usage=freeze_msg.UNFREEZE_USAGE, role=Role.ADMIN,
                  summary="Lift a pool's or the cluster's freeze now; runs it held go on",
                  examples=("/gpu unfreeze serving-a incident resolved",))
def unfreeze(call: Call, args: list[str]) -> Reply:
    service = _freezes(call)
    words = [word for arg in args for word in arg.split()]
    if not words:
        raise UsageError(freeze_msg.unfreeze_needs_target())
    try:
        lifted = service.lift(call.actor, target=words[0], reason=" ".join(words[1:]), now=call.now)
    except FreezeRefused as err:
        return error_reply(msg.refused_title(), str(err))
    return Reply(title=freeze_msg.unfrozen_title(lifted.target), visibility="in_channel",
                 summary=freeze_msg.unfreeze_summary(by=lifted.lifted_by_name or call.actor.name, set_by=lifted.set_by_name,
                                              until=when(lifted.until, call.services.config.display_zone), reason=lifted.lift_reason or ""))


@REGISTRY.command("freezes", usage="freezes", role=Role.VIEWER, changes=False,
                  summary="The change freezes in force: what, until when, by whom, why",
                  examples=("/gpu freezes",))
def freezes(call: Call, args: list[str]) -> Reply:
    if args:
        raise UsageError(f"freezes takes no words, got {len(args)}")
    found = _freezes(call).in_force(call.now)
    if not found:
        return Reply(title=freeze_msg.freezes_title(0), summary=freeze_msg.freezes_none())
    rows = []
    for frozen in found:
        runs, _ = _covered(call, frozen)
        rows.append((frozen.target, when(frozen.until, call.services.config.display_zone, style="table"), frozen.set_by_name,
                     freeze_msg.freeze_runs_cell(runs, let_running_finish=frozen.let_running_finish), frozen.reason or "-"))
    return Reply(title=freeze_msg.freezes_title(len(found)),
                 sections=(Section(table=Table(columns=freeze_msg.FREEZE_COLUMNS, rows=tuple(rows))),))
