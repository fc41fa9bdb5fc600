"""Replies as plain text, for the console and the command line (Jinja2 template
`templates/reply.txt.j2`). Nothing is cut here: a terminal scrolls.

What reaches a terminal goes through `terminal_safe`: a reason or a name is text someone
typed into Slack, and an escape sequence in it would otherwise act on the reader's
terminal (clear the screen, rewrite a line with a carriage return, recolour a warning,
set the window title, print a link that points elsewhere)."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from bot import messages as msg
from bot.intents import confirm_for
from commands.reply import Fact, Intent, Reply, Table

_TEMPLATES = Path(__file__).with_name("templates")

# ECMA-48 sequences: CSI (ESC [ or the C1 byte), OSC/DCS/APC/PM/SOS strings ended by BEL
# or ST on the same line (an unended one loses only its introducer, never the text after
# it), and two-character escapes; then any control character left, but tab and newline;
# and the bidirectional overrides that make text read in another order than it is.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[\x20-\x7e]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """`text` with terminal control sequences removed and other control characters
    shown as U+FFFD, so what is printed is only what it says (tabs and newlines stay)."""
    return _CONTROL.sub("\ufffd", _SEQUENCE.sub("", text))


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
_ENV.globals["text_heading"] = msg.text_heading


def render_text(reply: Reply) -> str:
    text = terminal_safe(_ENV.get_template("reply.txt.j2").render(reply=reply))
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
