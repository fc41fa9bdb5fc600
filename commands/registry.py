"""The command registry and the one dispatcher every entry point uses.

A command is a plain function `(call, args) -> Reply` registered with its words, usage,
the role it needs, whether it asks for confirmation and whether it changes something
(`changes`: True unless registered `changes=False`, so a new command is taken to change
something until it says it only reads; entry points read the user's roles afresh for
one that changes something). The dispatcher splits the text,
finds the command (longest match of words), checks the role (failing closed), and turns
bad input into that command's usage with the closest match. Help comes from here too,
and hides what the asking user cannot run.

Text is split once, where a person typed it (`dispatch`); words split already (the
command line's argv) go to `dispatch_words`, and a command whose values are read already
(a button's id, App Home's fleet view, a form's request) runs through the same door with
them (`run_command`, `invoke`): no line is written only to be split again.

A kind of change's commands come with its registry line (workflows/kinds.py `commands`):
the registry imports that module the first time it is read with the kind in force, and
offers a command registered with `kind=` only while that kind is in force.
"""

from __future__ import annotations

import datetime as dt
import difflib
import importlib
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from commands import messages as msg
from commands import cluster_messages as cluster_msg
from commands.clusters import ClusterChoiceError, actor_in, choose_cluster, name_cluster, services_about
from commands.reply import Reply, Section, Table, error_reply
from commands.services import Services
from workflows.access import AccessDenied, Actor, Role
from workflows.fleet.clusters import ClusterUnreachable
from workflows.kinds import kinds_in_force


class UsageError(Exception):
    """The arguments do not fit the command; the message says what is wrong."""


class NotFoundError(Exception):
    """A named thing (node, pool, request) does not exist; the message offers the closest."""


@dataclass(frozen=True)
class Call:
    """One invocation: who, when, with what services."""

    actor: Actor
    now: dt.datetime
    services: Services
    text: str = ""
    # The Slack channel the command was typed in (None off Slack): where a request's
    # thread is posted.
    channel: str | None = None


Handler = Callable[[Call, list[str]], Reply]


@dataclass(frozen=True)
class CommandSpec:
    words: tuple[str, ...]
    handler: Handler
    usage: str
    summary: str
    role: Role
    examples: tuple[str, ...] = ()
    confirm: bool = False
    # Does running it change anything (a request, a run, a freeze, a node)? Then the
    # user's roles are read afresh, not from a cache (`bot.identity`).
    changes: bool = True
    # The kind of change it asks for or acts on (offered while the kind is in force);
    # None for a command of every kind (`rollback`, `approve`).
    kind: str | None = None

    @property
    def name(self) -> str:
        return " ".join(self.words)


def kind_commands_loaded() -> None:
    """Import the commands module of each kind in force not imported yet (its registry
    line's `commands`), so its commands, answer and request button are registered."""
    for kind in kinds_in_force():
        if kind.commands is not None and kind.commands not in sys.modules:
            importlib.import_module(kind.commands)


@dataclass
class Registry:
    registered: dict[tuple[str, ...], CommandSpec] = field(default_factory=dict)

    @property
    def commands(self) -> dict[tuple[str, ...], CommandSpec]:
        """Every command offered now: the product's, and those of the kinds in force."""
        kind_commands_loaded()
        in_force = kinds_in_force()
        return {words: spec for words, spec in self.registered.items() if spec.kind is None or spec.kind in in_force}

    def command(self, words: str, *, usage: str, summary: str, role: Role,
                examples: tuple[str, ...] = (), confirm: bool = False,
                changes: bool = True, kind: str | None = None) -> Callable[[Handler], Handler]:
        def tag(handler: Handler) -> Handler:
            key = tuple(words.split())
            if key in self.registered:
                raise ValueError(f"command {words!r} registered twice")
            self.registered[key] = CommandSpec(words=key, handler=handler, usage=usage, summary=summary, role=role,
                                               examples=examples, confirm=confirm, changes=changes, kind=kind)
            return handler
        return tag

    def resolve(self, tokens: list[str]) -> tuple[CommandSpec | None, list[str]]:
        lowered = [t.lower() for t in tokens]
        offered = self.commands
        for length in range(min(len(tokens), 3), 0, -1):
            spec = offered.get(tuple(lowered[:length]))
            if spec is not None:
                return spec, tokens[length:]
        return None, tokens

    def closest(self, tokens: list[str]) -> list[str]:
        names = [spec.name for spec in self.commands.values()]
        guess = " ".join(tokens[:2]).lower()
        found = difflib.get_close_matches(guess, names, n=3, cutoff=0.5)
        if not found and tokens:
            found = difflib.get_close_matches(tokens[0].lower(), names, n=3, cutoff=0.5)
        return found

    def changes(self, text: str) -> bool:
        """Does the `/gpu ...` line `text` run a command that changes something? Split as
        `dispatch` splits (a quoted `"approve"` is seen too); False for a line dispatch
        refuses unread."""
        try:
            tokens = shlex.split(text)
        except ValueError:
            return False
        spec, _ = self.resolve(tokens[1:] if tokens[:1] == ["/gpu"] else tokens)
        return spec is not None and spec.changes

    def visible_to(self, actor: Actor) -> list[CommandSpec]:
        return sorted((s for s in self.commands.values() if actor.has_anywhere(s.role)), key=lambda s: s.name)


REGISTRY = Registry()


# The pool and node names the examples are written with; shown with this fleet's own.
SAMPLE_POOLS = frozenset({"serving-a", "training-a", "train-a"})
SAMPLE_NODES = frozenset({"gpu-a-01", "gpu-a-02", "serving-a-05"})


def examples_for(spec: CommandSpec, services: Services | None, now: dt.datetime | None) -> tuple[str, ...]:
    """`spec.examples` naming a configured pool and its nodes, so they can be typed as
    they are; as written when there is no fleet to take names from."""
    if services is None or now is None or not spec.examples:
        return spec.examples
    try:
        fleet = services.fleet.fleet(now)
    except Exception:  # noqa: BLE001 - help must answer even when the fleet cannot be read
        return spec.examples
    pools = [name for name in services.config.pools if (p := fleet.pool(name)) is not None and p.nodes]
    pools = pools or list(services.config.pools) or [p.name for p in fleet.pools]
    if not pools:
        return spec.examples
    found = fleet.pool(pools[0])
    nodes = list(found.nodes) if found is not None and found.nodes else sorted(fleet.nodes)

    def local(example: str) -> str:
        words, taken = [], 0
        for word in example.split(" "):
            if word in SAMPLE_POOLS:
                word = pools[0]
            elif word in SAMPLE_NODES and nodes:
                word, taken = nodes[taken % len(nodes)], taken + 1
            words.append(word)
        return " ".join(words)

    return tuple(local(e) for e in spec.examples)


def usage_reply(spec: CommandSpec, problem: str, *, services: Services | None = None,
                now: dt.datetime | None = None) -> Reply:
    examples = examples_for(spec, services, now)
    return Reply(title=msg.usage_title(spec.usage), summary=problem, ok=False,
                 footer=msg.examples_line(examples) if examples else None)


def dispatch(text: str, *, actor: Actor, services: Services, now: dt.datetime,
             channel: str | None = None) -> Reply:
    """Run one `/gpu ...` command line for `actor` and return its Reply."""
    try:
        tokens = shlex.split(text)
    except ValueError as err:
        return error_reply(msg.cannot_read_command(), msg.unbalanced_quotes(str(err)))
    if tokens and tokens[0] == "/gpu":
        tokens = tokens[1:]
    return dispatch_words(tokens, actor=actor, services=services, now=now, channel=channel, text=text)


def dispatch_words(words: Sequence[str], *, actor: Actor, services: Services, now: dt.datetime,
                   channel: str | None = None, text: str | None = None) -> Reply:
    """Run the command `words` name with the rest as its arguments, each word as it is:
    what `dispatch` does once it has split a typed line, for words split already (the
    command line's argv), so they are never joined and split again."""
    tokens = list(words)
    text = shlex.join(tokens) if text is None else text
    if not tokens:
        return help_reply(actor, [])
    spec, args = REGISTRY.resolve(tokens)
    if spec is None:
        return error_reply(msg.unknown_command(" ".join(tokens[:2])), msg.did_you_mean(REGISTRY.closest(tokens)),
                           hint=msg.see_help())
    try:
        args, services = choose_cluster(args, services, channel=channel)
    except ClusterChoiceError as err:
        return usage_reply(spec, str(err), services=services, now=now)
    return _in_cluster(spec, lambda call: spec.handler(call, args), actor=actor, services=services, now=now,
                       text=text, channel=channel)


def run_command(words: str, run: Callable[[Call], Reply], *, actor: Actor, services: Services,
                now: dt.datetime, about: str | None = None, channel: str | None = None) -> Reply:
    """Run `run` as the registered command `words` ("request", "migrate confirm") with its
    values already read: what a button or the Home tab asks for, with no line made for
    the dispatcher to split again, so an id or a node name is only ever that value. Everything else is a typed command's: the cluster of the request or run `about`
    names (else the channel's, else the home one), the role checked at the door, refusals
    as replies, the title naming the cluster."""
    spec = REGISTRY.commands[tuple(words.split())]
    return _in_cluster(spec, run, actor=actor, services=services_about(services, subject=about, channel=channel),
                       now=now, channel=channel)


def _in_cluster(spec: CommandSpec, run: Callable[[Call], Reply], *, actor: Actor, services: Services,
                now: dt.datetime, text: str = "", channel: str | None = None) -> Reply:
    """`invoke` in the cluster `services` address, as that cluster sees `actor`."""
    return name_cluster(invoke(spec, run, actor=actor, services=services, now=now, text=text, channel=channel),
                        services)


def invoke(spec: CommandSpec, run: Callable[[Call], Reply], *, actor: Actor, services: Services,
           now: dt.datetime, text: str = "", channel: str | None = None) -> Reply:
    """Run `run` as command `spec` for `actor`: the role is checked at the door and a
    refusal (bad input, an unknown name, a missing role) becomes its reply. `dispatch`
    runs typed commands this way, `run_command` a click's; a form that asks what a command
    asks (the drain form) runs its structured request this way too. `actor` is taken as
    the cluster `services` address sees them (with several clusters the bot's directory
    reads them against no cluster's pools, so a pool's operators and approvers would
    otherwise be missed, and the fleet's operators keep an exclusive pool)."""
    actor = actor_in(services, actor)
    if not actor.has_anywhere(spec.role):
        return error_reply(msg.not_allowed_title(), msg.needs_role(spec.name, spec.role, actor))
    call = Call(actor=actor, now=now, services=services, text=text, channel=channel)
    try:
        return run(call)
    except UsageError as err:
        return usage_reply(spec, str(err), services=services, now=now)
    except NotFoundError as err:
        return error_reply(msg.not_found_title(), str(err))
    except AccessDenied as err:
        return error_reply(msg.not_allowed_title(), access_refusal(err, services))
    except ClusterUnreachable as err:
        return error_reply(cluster_msg.cluster_unreachable_title(), err.text(services.config.display_zone))


def access_refusal(err: AccessDenied, services: Services) -> str:
    """What a refusal for a missing role says: its sentence and, when the operator role
    of a configured pool was missing, who may act on that pool (its own operators, the
    fleet's when they keep it, and admins)."""
    policy = services.config.pools.get(err.pool) if err.pool is not None else None
    if err.role is not Role.OPERATOR or err.pool is None or policy is None:
        return str(err)
    own = msg.operator_names(policy.operators, services.config.names)
    return msg.access_refused(str(err), msg.who_may_operate(err.pool, own, fleet_operators=policy.global_operators))


def help_reply(actor: Actor, args: list[str], *, services: Services | None = None,
               now: dt.datetime | None = None) -> Reply:
    if args:
        spec, rest = REGISTRY.resolve(args)
        if spec is None or rest:
            return error_reply(msg.unknown_command(" ".join(args)), msg.did_you_mean(REGISTRY.closest(args)))
        return Reply(title=msg.usage_title(spec.usage), summary=spec.summary, sections=(
            Section(bullets=tuple(msg.example(e) for e in examples_for(spec, services, now))),
            Section(text=msg.role_needed(spec.role, actor.has_anywhere(spec.role))),
        ))
    visible = REGISTRY.visible_to(actor)
    if not visible:
        return error_reply(msg.not_allowed_title(), msg.no_role(actor))
    rows = tuple(row for spec in visible for row in msg.help_rows(spec.name, spec.summary, str(spec.role)))
    return Reply(title=msg.help_title(), summary=msg.help_summary(),
                 sections=(Section(table=Table(columns=msg.HELP_COLUMNS, rows=rows)),))


@REGISTRY.command("help", usage="help [command]", summary="What gpuops can do, and how", role=Role.VIEWER,
                  examples=("/gpu help", "/gpu help drain"), changes=False)
def help_command(call: Call, args: list[str]) -> Reply:
    return help_reply(call.actor, args, services=call.services, now=call.now)
