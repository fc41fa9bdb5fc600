"""Laying the handover checklist out with a rotation's own Jinja2 template.

gpuops lays a checklist out itself (`commands.handover.render_checklist`, from its
values). A rotation may name its own Jinja2 template instead (`rotations[].template`):
`ChecklistTemplate` says what such a template receives and what it writes;
`templates/handover.md.j2` is gpuops's own layout written that way, a starting point.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import jinja2
import jinja2.sandbox

from workflows.fleet.findings import Severity, format_age
from workflows.handover.checklist import (
    Changes,
    Checklist,
    ChecklistItem,
    ClusterFacts,
    CordonSeen,
    FindingKey,
    ItemKind,
    PoolDrain,
)
from workflows.wording import when


class TemplateProblem(Exception):
    """A checklist template cannot be used: the file, the line (when known) and why."""

    def __init__(self, *, path: Path, line: int | None, reason: str) -> None:
        where = f"template {path}" + (f", line {line}" if line else "")
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class ChecklistTemplate:
    """A rotation's own checklist template (`rotations[].template`), compiled, that
    rendered the sample checklist without error when the configuration loaded.

    What it receives:

    - `checklist`, the `Checklist`: `rotation`, `team`, `shift` (the incoming shift's
      name), `shift_start`, `shift_end`, `generated_at` (times), `timezone`, `late`,
      `missed` (earlier shift changes with no handover), `all_clear`; `cluster`
      (`operator`, `cluster_policy`, `owner`); the item lists `needs_action` (most severe
      first), `failures` (what went wrong in runs since the last handover), `in_flight`,
      `coming_up` (windows starting this shift) and `for_information`, each item with
      `kind`, `severity` (critical, warning, info), `subject`, `text`, `command` (the
      `/gpu` command that shows more) and `code` (a finding's); `last_drains` (`pool`,
      `text`, `command`); `changes` (none without an earlier handover, else `since`, `new`
      and `resolved` items); `history_command`.
    - the filters `when` (a time in the rotation's zone: "Sat 07 Jun 14:00 CEST") and `ago`
      (how long before the checklist was made: "2h 5m").

    It runs sandboxed (no Python internals, nothing it is given can be changed), and a
    name the checklist lacks is an error, not an empty string.

    What it writes: the message, one line each (blank lines are skipped):

        # text                        the title (the first one; else "Handover to the <shift> shift")
        ## text                       a new section with this title
        * severity: text | /gpu ...   an item: critical, warning or info, then the command
                                      that shows more (after " | ", optional)
        - text                        a bullet
        ~ text                        a line of the footer
        any other text                text of the current section (before any: the summary)

    Every value is written on the line the template writes it on (a line break inside a
    value becomes a space), so nothing a checklist holds, such as a pod's log in a
    failure's reason, adds a line of its own. The Acknowledge button, who acknowledged
    and the audit head are added after the template's footer, as for gpuops's own layout.
    """

    path: Path
    template: jinja2.Template = field(repr=False, compare=False)

    def render(self, checklist: Checklist) -> str:
        """The template's lines for `checklist`; TemplateProblem (its file, line and why)
        when it fails on this checklist although it rendered the sample."""
        try:
            return self.template.render(checklist=checklist)
        except jinja2.TemplateError as err:
            raise TemplateProblem(path=self.path, line=_template_line(err.__traceback__, self.template),
                                  reason=err.message or type(err).__name__) from None
        except Exception as err:  # noqa: BLE001 - any failure of a team's template is theirs to fix
            raise TemplateProblem(path=self.path, line=_template_line(err.__traceback__, self.template),
                                  reason=f"{type(err).__name__}: {err}") from None


def load_template(path: Path) -> ChecklistTemplate:
    """Compile the template at `path` and render the sample checklist with it, so a
    syntax error, a misspelt field or a failing filter stops the start, not a handover.
    A file is compiled once until it changes."""
    path = Path(path)
    if not path.is_file():
        reason = "no such file" if not path.exists() else "not a file"
        raise TemplateProblem(path=path, line=None, reason=reason)
    stat = path.stat()
    return _load_template(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _load_template(path: Path, mtime_ns: int, size: int) -> ChecklistTemplate:
    environment = _environment(str(path.resolve().parent))
    try:
        template = environment.get_template(path.name)
    except jinja2.TemplateSyntaxError as err:
        raise TemplateProblem(path=Path(err.filename or path), line=err.lineno,
                              reason=err.message or "syntax error") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TemplateProblem(path=path, line=None, reason=f"cannot read it: {err}") from None
    compiled = ChecklistTemplate(path=path, template=template)
    compiled.render(sample_checklist())  # a failure is a TemplateProblem: a configuration error
    return compiled


@lru_cache(maxsize=None)
def _environment(folder: str) -> jinja2.Environment:
    # Sandboxed: a team's template is configuration, not code, so it may read the
    # checklist's fields but never reach Python's internals (`__class__`, `__globals__`,
    # `mro()`) nor call methods that change what they are given.
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain lines; the renderers escape for their medium
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_one_line,
    )
    environment.filters["when"] = _when
    environment.filters["ago"] = _ago
    return environment


def _one_line(value: Any) -> Any:
    """A value as the template prints it: on one line, whatever it holds (each line the
    template writes is read for what it is, so a value must not start lines)."""
    if not isinstance(value, str):
        return value
    lines = value.splitlines()
    return " ".join(lines) if len(lines) != 1 or lines[0] != value else value


@jinja2.pass_context
def _when(context: jinja2.runtime.Context, at: dt.datetime) -> str:
    """A time in the rotation's zone: "Sat 07 Jun 14:00 CEST"."""
    return when(at, context["checklist"].zone, style="day")


@jinja2.pass_context
def _ago(context: jinja2.runtime.Context, at: dt.datetime) -> str:
    """How long before the checklist was made: "2h 5m"."""
    return format_age(context["checklist"].generated_at - at)


def _template_line(tb: TracebackType | None, template: jinja2.Template) -> int | None:
    # Jinja rewrites tracebacks so that template frames carry the template's file name
    # and line numbers; the deepest such frame is where the render failed.
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == template.filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def sample_checklist() -> Checklist:
    """A checklist with something in every list, to try templates on at start."""
    start = dt.datetime(2025, 6, 7, 6, 0, tzinfo=dt.timezone.utc)

    def item(kind: ItemKind, severity: Severity, subject: str) -> ChecklistItem:
        return ChecklistItem(kind=kind, severity=severity, subject=subject,
                             text=f"sample {kind} about {subject}", command=f"/gpu node {subject}",
                             code="driver-conflict" if kind == "finding" else None)

    return Checklist(
        rotation="sample", team="Sample team", shift="day", shift_start=start,
        shift_end=start + dt.timedelta(hours=12), timezone="UTC",
        generated_at=start + dt.timedelta(minutes=7), late=True, missed=1,
        cluster=ClusterFacts(operator="v26.7.0 in gpu-operator",
                             cluster_policy="cluster-policy (ready)", owner="gpu-platform"),
        needs_action=(item("finding", "critical", "gpu-01"), item("cordon", "warning", "gpu-02")),
        in_flight=(item("run", "info", "run-000000"),),
        coming_up=(item("window", "info", "req-000000"),),
        for_information=(item("finding", "info", "unpooled"),),
        last_drains=(PoolDrain(pool="train-a", text="no drains recorded", command="/gpu status train-a"),),
        changes=Changes(since=start - dt.timedelta(hours=12),
                        new=(item("finding", "critical", "gpu-01"),),
                        resolved=(item("finding", "warning", "gpu-03"),)),
        finding_keys=(FindingKey(code="driver-conflict", subject="gpu-01", severity="critical"),),
        cordons=(CordonSeen(node="gpu-02", since=start),),
        history_command="/gpu handover history sample",
        failures=(item("failure", "warning", "run-000001"),),
    )
