"""Replies as plain text, for the console and the command line (Jinja2 template
`templates/reply.txt.j2`)."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from commands.reply import Fact, Reply, Table

_TEMPLATES = Path(__file__).with_name("templates")


def _table(table: Table) -> str:
    rows = [table.columns, *table.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(table.columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _label_width(facts: tuple[Fact, ...]) -> int:
    return max((len(f.label) + 1 for f in facts), default=0)


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=False,
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_ENV.filters["table"] = _table
_ENV.filters["ljust"] = lambda text, width: str(text).ljust(width)
_ENV.globals["label_width"] = _label_width


def render_text(reply: Reply) -> str:
    text = _ENV.get_template("reply.txt.j2").render(reply=reply)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
