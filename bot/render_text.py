"""Replies as plain text, for the console and the command line (Jinja2 template
`templates/reply.txt.j2`). Nothing is cut here: a terminal scrolls."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from bot.intents import confirm_for
from commands.reply import Fact, Intent, Reply, Table

_TEMPLATES = Path(__file__).with_name("templates")


def _cell(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


def table_lines(table: Table, *, max_cell: int | None = None) -> list[str]:
    """The table as aligned lines: header, a rule, then one line per row. With
    `max_cell`, longer cells are cut with an ellipsis."""
    rows = [tuple(_cell(c, max_cell) for c in row) for row in (table.columns, *table.rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(table.columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def _table(table: Table) -> str:
    return "\n".join(table_lines(table))


def _label_width(facts: tuple[Fact, ...]) -> int:
    return max((len(f.label) + 1 for f in facts), default=0)


def _asks_to_confirm(intent: Intent) -> bool:
    return confirm_for(intent) is not None


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=False,
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_ENV.filters["table"] = _table
_ENV.filters["ljust"] = lambda text, width: str(text).ljust(width)
_ENV.globals["label_width"] = _label_width
_ENV.globals["asks_to_confirm"] = _asks_to_confirm


def render_text(reply: Reply) -> str:
    text = _ENV.get_template("reply.txt.j2").render(reply=reply)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
