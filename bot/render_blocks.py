"""Replies as Block Kit, built with slack_sdk's block models (whose `to_dict()` checks
most of Slack's limits) and human text from `templates/blocks.mrkdwn.j2`, escaped for
Slack mrkdwn.

Slack refuses a message that breaks a limit, so this module never produces one:

- at most `max_blocks` blocks (50 in a message, 100 in the Home tab or a modal);
- section text <= 3000 characters, fields <= 10 of <= 2000, header <= 150, buttons
  <= 25 per actions block with labels <= 75;
- tables are monospace code blocks of whole rows, at most `TABLE_BLOCKS` blocks each;
  notices and bullets at most `LIST_BLOCKS` blocks each, so one long part cannot crowd
  out the rest of the reply.

What does not fit is cut at a row boundary with "…and N more"; the result is then
`truncated`, and the Slack layer uploads the full text as a file and renders again with
`full_text` pointing at it (it says so in a context line).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

from bot import intents as buttons
from bot.render_text import table_lines
from commands.reply import Intent, Reply, Section, Table
from workflows.access import MENTION, Mention

MESSAGE_BLOCKS = 50
VIEW_BLOCKS = 100
SECTION_TEXT = 3000
SECTION_FIELDS = 10
FIELD_TEXT = 2000
HEADER_TEXT = 150
BUTTON_TEXT = 75
ACTIONS_ELEMENTS = 25
CONFIRM_TITLE, CONFIRM_TEXT, CONFIRM_BUTTON = 100, 300, 30
CONTEXT_TEXT = 3000
# chat.postMessage truncates `text` past 40,000 characters; Slack asks for under 4,000.
NOTIFICATION_TEXT = 3000

TABLE_BLOCKS = 3
LIST_BLOCKS = 2
FACT_BLOCKS = 2
# A table cell longer than this is cut, so a long state does not wrap every row.
CELL_WIDTH = 48
# Wider than this, a table of at most LIST_TABLE_COLUMNS columns is shown as a list.
CODE_BLOCK_WIDTH = 90
LIST_TABLE_COLUMNS = 3
# Characters kept free in a packed block for the "…and N more" line.
_ROOM = 80

_ICONS = {"critical": ":red_circle:", "warning": ":large_orange_circle:", "info": ":large_blue_circle:"}
_TEMPLATES = Path(__file__).with_name("templates")


class Mrkdwn(str):
    """Text that is already mrkdwn (escaped where needed): the template leaves it alone."""


def escape(text: str) -> str:
    """Slack's mrkdwn escaping: only &, < and > (it decodes no other entity), which
    also keeps user text from forming <!channel>, <@U…> or <url|links>."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn_value(value: Any) -> str:
    """A value as mrkdwn: escaped, but for text already mrkdwn and for a `Mention`
    gpuops wrote (a person named as Slack shows that very user, never by a display name)."""
    if isinstance(value, Mrkdwn):
        return value
    if isinstance(value, Mention) and MENTION.fullmatch(value):
        return str(value)
    return escape("" if value is None else str(value))


_finalize = mrkdwn_value


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=False,
                          finalize=_finalize, undefined=jinja2.StrictUndefined)
_T: Any = _ENV.get_template("blocks.mrkdwn.j2").module  # its macros, called by name


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters, ending in "…" when cut, never inside an entity."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    cut = re.sub(r"&[a-z]{0,3}$", "", cut)
    return cut + "…"


def _plain(text: str, limit: int, *, fallback: str = "…") -> PlainTextObject:
    # Slack refuses an empty text; a blank title or label shows the fallback instead.
    return PlainTextObject(text=_cut(" ".join(text.split()) or fallback, limit), emoji=True)


def _mrkdwn(text: str, limit: int = SECTION_TEXT) -> MarkdownTextObject:
    return MarkdownTextObject(text=_cut(text if text.strip() else "…", limit))


@dataclass(frozen=True)
class FileLink:
    url: str
    filename: str


@dataclass(frozen=True)
class RenderedMessage:
    text: str  # the notification and fallback text
    blocks: list[dict[str, Any]]
    truncated: bool  # something was left out

    def as_message(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


# ------------------------------------------------------------------ packing text into blocks


def _pack(lines: Sequence[str], *, max_blocks: int, overhead: Callable[[int], int]) -> tuple[list[list[str]], int]:
    """Whole lines, greedily, into at most `max_blocks` groups whose joined text plus
    `overhead(group index)` fits in a section; returns the groups and how many lines
    were left out."""
    if max_blocks <= 0 or not lines:
        return [], len(lines)
    groups: list[list[str]] = [[]]
    size = 0
    for index, line in enumerate(lines):
        budget = SECTION_TEXT - _ROOM - overhead(len(groups) - 1)
        line = _cut(line, budget)
        cost = len(line) + 1
        if groups[-1] and size + cost > budget:
            if len(groups) >= max_blocks:
                return groups, len(lines) - index
            groups.append([])
            size = 0
        groups[-1].append(line)
        size += cost
    return groups, 0


class _Body:
    """Blocks of the reply's sections, within a block budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.blocks: list[Block] = []
        self.truncated = False

    @property
    def room(self) -> int:
        return self.limit - len(self.blocks)

    def add_section(self, section: Section) -> None:
        parts = self._parts(section)
        if not parts:
            return
        if self.blocks:
            if self.room < 2:
                self.truncated = True
                return
            self.blocks.append(DividerBlock())
        for part in parts:
            if self.room <= 0:
                self.truncated = True
                return
            self.blocks.extend(part(self.room))

    def _parts(self, section: Section) -> list[Callable[[int], list[Block]]]:
        """One builder per part, each given the room left; the title rides on the first."""
        title = Mrkdwn(_T.title(section.title)) if section.title else None
        parts: list[Callable[[int], list[Block]]] = []

        def take_title() -> Mrkdwn | None:
            nonlocal title
            taken, title = title, None
            return taken

        if (section.text or "").strip() or (title and not (section.facts or section.notices or section.bullets or section.table)):
            def text_part(room: int) -> list[Block]:
                head = take_title()
                body = _T.text(section.text) if (section.text or "").strip() else ""
                return [SectionBlock(text=_mrkdwn("\n".join(p for p in (head, body) if p)))] if room > 0 else []
            parts.append(text_part)
        if section.facts:
            parts.append(lambda room: self._facts(section, take_title(), room))
        if section.notices:
            lines = [Mrkdwn(_T.notice(n, _ICONS.get(n.severity, ""))) for n in section.notices]
            parts.append(lambda room: self._lines(lines, take_title(), room, LIST_BLOCKS, "findings"))
        if section.bullets:
            lines = [Mrkdwn(_T.bullet(b)) for b in section.bullets]
            parts.append(lambda room: self._lines(lines, take_title(), room, LIST_BLOCKS, "items"))
        if section.table is not None:
            parts.append(lambda room: self._table(section, take_title(), room))
        return parts

    def _facts(self, section: Section, title: Mrkdwn | None, room: int) -> list[Block]:
        fields = [_mrkdwn(_T.fact(f), FIELD_TEXT) for f in section.facts]
        blocks: list[Block] = []
        for start in range(0, len(fields), SECTION_FIELDS):
            if len(blocks) >= min(FACT_BLOCKS, room):
                self.truncated = True
                break
            text = _mrkdwn(title) if title and not blocks else None
            blocks.append(SectionBlock(text=text, fields=fields[start:start + SECTION_FIELDS]))
        return blocks

    def _lines(self, lines: Sequence[str], title: Mrkdwn | None, room: int, most: int, what: str) -> list[Block]:
        title_cost = len(title) + 1 if title else 0
        groups, omitted = _pack(lines, max_blocks=min(most, room), overhead=lambda i: title_cost if i == 0 else 0)
        if not groups:
            self.truncated = True
            return []
        if omitted:
            self.truncated = True
            groups[-1].append(_T.more(omitted, what))
        if title:
            groups[0].insert(0, title)
        return [SectionBlock(text=_mrkdwn("\n".join(g))) for g in groups]

    def _table(self, section: Section, title: Mrkdwn | None, room: int) -> list[Block]:
        assert section.table is not None
        if _reads_better_as_a_list(section.table):
            items = [Mrkdwn(_T.table_row([cell.replace("`", "'") for cell in row])) for row in section.table.rows]
            return self._lines(items, title, room, TABLE_BLOCKS, "rows")
        lines = [escape(line.replace("`", "'")) for line in table_lines(section.table, max_cell=CELL_WIDTH)]
        header, rows = lines[:2], lines[2:]
        head_cost = sum(len(h) + 1 for h in header) + 8  # the fences and their newlines
        title_cost = len(title) + 1 if title else 0
        groups, omitted = _pack(rows, max_blocks=min(TABLE_BLOCKS, room),
                                overhead=lambda i: head_cost + (title_cost if i == 0 else 0))
        if not groups:
            if rows:
                self.truncated = True
                return []
            groups = [[]]
        blocks: list[Block] = []
        for index, group in enumerate(groups):
            text = _T.code(Mrkdwn("\n".join(header + group)))
            if index == 0 and title:
                text = f"{title}\n{text}"
            if omitted and index == len(groups) - 1:
                text = f"{text}\n{_T.more(omitted, 'rows')}"
            blocks.append(SectionBlock(text=_mrkdwn(text)))
        if omitted:
            self.truncated = True
        return blocks


def _reads_better_as_a_list(table: Table) -> bool:
    """A table of a few columns holding prose (like /gpu help) wraps into an unreadable
    code block on a laptop screen; as a list it reads well at any width."""
    return len(table.columns) <= LIST_TABLE_COLUMNS and max(
        (len(line) for line in table_lines(table)), default=0) > CODE_BLOCK_WIDTH


# ------------------------------------------------------------------ buttons


def _confirm(intent: Intent) -> ConfirmObject | None:
    confirm = buttons.confirm_for(intent)
    if confirm is None:
        return None
    return ConfirmObject(
        title=_plain(confirm.title, CONFIRM_TITLE),
        text=_mrkdwn(escape(confirm.text), CONFIRM_TEXT),
        confirm=_plain(confirm.confirm, CONFIRM_BUTTON),
        deny=_plain(confirm.deny, CONFIRM_BUTTON),
        style="danger" if intent.action in buttons.DESTRUCTIVE else None,
    )


def actions_blocks(intents: Sequence[Intent], *, first_index: int = 0, block_id: str = "intents") -> list[Block]:
    """Buttons, 25 to an actions block, each with its opaque value (none when it names
    nothing, as the Home tab's "Request a drain") and, when it cannot be undone, a
    confirmation dialog."""
    elements = [
        ButtonElement(text=_plain(intent.label, BUTTON_TEXT), action_id=buttons.action_id(intent, first_index + i),
                      value=intent.value or None, style=intent.style, confirm=_confirm(intent))
        for i, intent in enumerate(intents)
    ]
    return [ActionsBlock(block_id=f"{block_id}-{n}" if n else block_id, elements=elements[start:start + ACTIONS_ELEMENTS])
            for n, start in enumerate(range(0, len(elements), ACTIONS_ELEMENTS))]


# ------------------------------------------------------------------ the whole reply


def header_text(reply: Reply) -> str:
    return (":warning: " if not reply.ok else "") + reply.title


def notification_text(reply: Reply) -> str:
    return _cut(_T.notification(reply), NOTIFICATION_TEXT)


def context_block(text: str) -> ContextBlock:
    return ContextBlock(elements=[_mrkdwn(text, CONTEXT_TEXT)])


def body_blocks(sections: Sequence[Section], *, limit: int) -> tuple[list[Block], bool]:
    """The sections' blocks within `limit` blocks; True when something was left out."""
    body = _Body(limit)
    for section in sections:
        if body.room <= 0:
            body.truncated = True
            break
        body.add_section(section)
    return body.blocks, body.truncated


def reply_blocks(reply: Reply, *, max_blocks: int, full_text: FileLink | None = None,
                 with_header: bool = True) -> tuple[list[Block], bool]:
    head: list[Block] = []
    if with_header:
        head.append(HeaderBlock(text=_plain(header_text(reply), HEADER_TEXT, fallback="gpuops")))
    if (reply.summary or "").strip():
        head.append(SectionBlock(text=_mrkdwn(_T.text(reply.summary))))
    tail: list[Block] = actions_blocks(reply.intents) if reply.intents else []
    if (reply.footer or "").strip():
        tail.append(context_block(_T.text(reply.footer)))
    body, truncated = body_blocks(reply.sections, limit=max_blocks - len(head) - len(tail) - 1)
    note: list[Block] = []
    if full_text is not None:
        note.append(context_block(_T.full_text(full_text.url, full_text.filename)))
    elif truncated:
        note.append(context_block(_T.cut_short()))
    return head + body + note + tail, truncated


def render_blocks(reply: Reply, *, max_blocks: int = MESSAGE_BLOCKS, full_text: FileLink | None = None) -> RenderedMessage:
    """The reply as a message: notification text and at most `max_blocks` blocks."""
    blocks, truncated = reply_blocks(reply, max_blocks=max_blocks, full_text=full_text)
    if len(blocks) > max_blocks:  # only with more buttons than any reply has
        raise ValueError(f"{len(blocks)} blocks do not fit in {max_blocks}")
    return RenderedMessage(text=notification_text(reply), blocks=[b.to_dict() for b in blocks], truncated=truncated)
