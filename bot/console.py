"""`gpuops console`: the Slack app's logic in a terminal.

Type `/gpu ...` and read the reply as text; type a button's number to click it. A
command goes through the same dispatcher and a click through the same handler
(`bot.clicks.press`) as in Slack, so role checks, the two-person rule and the plan-hash
check are identical: only the identity is taken on trust (`--as`, `:as`), which is why
the console is for people who can already read the database and the cluster.
Destructive buttons ask to confirm, as Slack's dialog does, and Deny asks for a reason,
as Slack's form does. "Request a drain", whose Slack form has no console twin, says
which `/gpu drain` to type. Roles come from the configuration's user ids; Slack user
groups are not looked up (there is no Slack here). A reply with a picture
(`/gpu status <pool> --chart`) writes it as a PNG file and prints its path.

Lines come from any iterable, so scripts and tests drive it like a person would:

    printf '/gpu status\\n' | gpuops console --as U0DAVE
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from bot import messages as msg
from bot.clicks import Click, ClickOutcome, press
from bot.intents import confirm_for
from bot.pictures import render_png
from bot.request_forms import form_of
from bot.render_text import render_text, terminal_safe
from bot.wiring import Runtime
from commands.catalog import dispatch
from commands.reply import Reply
from workflows.access import Actor, effective_roles
from workflows.durations import utc_now

# Reads one line, showing the prompt; None at the end of input.
Reader = Callable[[str], str | None]


def _roles(actor: Actor) -> str:
    roles = sorted(effective_roles(actor.roles))
    pools = [f"{role} of {pool}" for pool, held in sorted(actor.pool_roles.items()) for role in sorted(held)]
    return ", ".join(roles + pools) or "no role"


class Console:
    def __init__(self, runtime: Runtime, *, out: TextIO, as_user: str, read: Reader,
                 clock: Callable[[], dt.datetime] = utc_now, pictures: Path | None = None) -> None:
        self.runtime = runtime
        # Where a reply's picture is written (a terminal shows no image).
        self.pictures = pictures or Path(tempfile.gettempdir()) / "gpuops-pictures"
        self.out = out
        self.read = read
        self.clock = clock
        self.actor = self._actor(as_user)
        self.last: Reply | None = None
        self.last_ok = True

    def _actor(self, user_id: str) -> Actor:
        return self.runtime.config.actor(user_id, via="console")

    def say(self, text: str) -> None:
        self.out.write(terminal_safe(text.rstrip("\n")) + "\n")
        self.out.flush()

    def show(self, reply: Reply) -> None:
        self.say(render_text(reply))
        if reply.picture is not None:
            self.pictures.mkdir(parents=True, exist_ok=True)
            path = self.pictures / reply.picture.file_name
            path.write_bytes(render_png(reply.picture))
            self.say(msg.picture_saved(str(path)))
        self.last = reply
        self.last_ok = reply.ok

    def prompt(self) -> str:
        return terminal_safe(f"{self.actor.name}> ")

    # -------------------------------------------------------------- the loop
    def run(self) -> int:
        self.say(msg.console_intro(self.actor.name, self.actor.user_id, _roles(self.actor)))
        while True:
            line = self.read(self.prompt())
            if line is None:
                break
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line in (":quit", ":q", ":exit"):
                break
            self.handle(line)
        self._say_runs_in_flight()
        return 0 if self.last_ok else 1

    def _say_runs_in_flight(self) -> None:
        runs = self.runtime.services().runs
        unfinished = [str(view.id) for view in runs.unfinished(every_cluster=True)] if runs is not None else []
        if unfinished:
            self.say(msg.console_exit_runs_in_flight(unfinished))

    def handle(self, line: str) -> None:
        if line.startswith(":as"):
            user_id = line[3:].strip()
            if not user_id:
                self.say(msg.console_usage())
                return
            self.actor = self._actor(user_id)
            self.say(msg.console_now_as(self.actor.name, self.actor.user_id, _roles(self.actor)))
        elif line in (":help", ":h", "?"):
            self.say(msg.console_usage())
        elif line.startswith(":"):
            self.say(msg.console_unknown(line))
        elif line.isdigit():
            if line.isascii():
                self.click(int(line))
            else:  # "²" is a digit to str.isdigit() but no number to int()
                intents = self.last.intents if self.last is not None else ()
                self.say(msg.console_no_such_button(line, len(intents)))
        else:
            services = self.runtime.services()
            self.show(dispatch(line, actor=self.actor, services=services, now=self.clock()))

    def click(self, number: int) -> None:
        intents = self.last.intents if self.last is not None else ()
        if not 1 <= number <= len(intents):
            self.say(msg.console_no_such_button(str(number), len(intents)))
            return
        intent = intents[number - 1]
        confirm = confirm_for(intent)
        if confirm is not None:
            self.say(msg.console_confirm(confirm.title, confirm.text, confirm.confirm))
            answer = (self.read("yes/no> ") or "").strip().lower()
            if answer not in ("y", "yes"):
                self.say(msg.console_went_back())
                return
        click = Click(action=intent.action, value=intent.value, actor=self.actor, now=self.clock())
        services = self.runtime.services()
        outcome = press(click, services)
        if outcome.wants_form is not None:
            form = form_of(outcome.wants_form.kind)
            self.say(form.in_console(form.usage(outcome.wants_form.target)))
            self.last_ok = True
            return
        if outcome.wants_reason is not None:
            self.say(msg.console_reason_prompt(outcome.wants_reason))
            reason = (self.read("reason> ") or "").strip()
            if not reason:
                self.say(msg.console_went_back())
                return
            outcome = press(Click(action=intent.action, value=intent.value, actor=self.actor, now=self.clock(),
                                  reason=reason), services)
        self.report(outcome)

    def report(self, outcome: ClickOutcome) -> None:
        self.say(f"{outcome.notice.title}: {outcome.notice.summary}")
        self.last_ok = outcome.ok
        if outcome.card is not None:
            self.say(render_text(outcome.card))
            self.last = outcome.card


def reader_of(lines: Iterable[str], *, out: TextIO, echo: bool) -> Reader:
    """A Reader over lines from a script or a pipe; with `echo`, each line is written
    after its prompt, so the output reads as a transcript."""
    iterator = iter(lines)

    def read(prompt: str) -> str | None:
        line = next(iterator, None)
        if line is not None and echo:
            out.write(terminal_safe(f"{prompt}{line.rstrip()}") + "\n")
        return line

    return read


def terminal_reader() -> Reader:
    def read(prompt: str) -> str | None:
        try:
            return input(prompt)
        except EOFError:
            return None

    return read


def run_console(lines: Iterable[str], *, runtime: Runtime, out: TextIO, as_user: str,
                clock: Callable[[], dt.datetime] = utc_now, echo: bool = True, pictures: Path | None = None) -> int:
    """Run the console over `lines` (a script, a pipe, a test); 0 if the last thing
    done worked, else 1. Pictures are written to `pictures` (a temporary folder)."""
    return Console(runtime, out=out, as_user=as_user, read=reader_of(lines, out=out, echo=echo), clock=clock,
                   pictures=pictures).run()
