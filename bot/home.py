"""The App Home tab: the fleet at a glance (the `/gpu status` reply, rendered for a view
of up to 100 blocks) and the requests waiting for the viewer's approval, each with its
Approve / Deny buttons; for those who may ask for drains, upgrades or MIG changes, a
"Request a drain", "Request a driver upgrade" and "Request a MIG change" button that open
those forms with nothing filled in; and the open requests that wait for something, each with
why in the words `/gpu request` uses (approvals, the window, a freeze, the pool's capacity,
a PodDisruptionBudget, a person). Published with views.publish when the
user opens the tab, and again after they click one of its buttons."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from slack_sdk.models.blocks import Block, DividerBlock, HeaderBlock, PlainTextObject, SectionBlock
from slack_sdk.models.views import View

from bot import messages as msg
from bot.render_blocks import (
    VIEW_BLOCKS,
    Mrkdwn,
    actions_blocks,
    context_block,
    escape,
    header_text,
    mrkdwn_value,
    reply_blocks,
)
from bot.request_card import request_card
from commands.reply import Intent, Reply
from workflows.requests.views import RequestView
from workflows.wording import when

# Each waiting request takes a section and an actions block.
WAITING_SHOWN = 10
# Requests that wait, with why: one section block of at most this many lines, each cut
# to WAIT_CHARS (a section's text holds 3000 characters).
WAITS_SHOWN = 6
WAIT_CHARS = 400


def _waiting_blocks(waiting: list[RequestView], *, now: dt.datetime, zone: dt.tzinfo) -> list[Block]:
    blocks: list[Block] = [SectionBlock(text=f"*{escape(msg.waiting_title(len(waiting)))}*")]
    for index, view in enumerate(waiting[:WAITING_SHOWN]):
        approvals = msg.approvals_tally(view.approvals_counted, view.approvals_required,
                                       [a.approver_name for a in view.approvals if a.counts])
        line = msg.waiting_line(escape(view.id), view.kind, escape(view.pool), mrkdwn_value(view.requester_name),
                                escape(view.reason[:500]), escape(approvals), when(view.expires_at, zone))
        blocks.append(SectionBlock(text=line))
        card = request_card(view, now=now, zone=zone)
        buttons = [i for i in card.intents if i.action in ("approve", "deny")]
        blocks.extend(actions_blocks(buttons, first_index=2 * index, block_id=f"waiting-{index}"))
    if len(waiting) > WAITING_SHOWN:
        blocks.append(context_block(escape(msg.more_waiting(len(waiting) - WAITING_SHOWN))))
    return blocks


def _waits_blocks(waits: list[tuple[RequestView, str]]) -> list[Block]:
    if not waits:
        return []
    lines = [f"*{escape(msg.waits_title(len(waits)))}*"]
    for view, why in waits[:WAITS_SHOWN]:
        why = why if len(why) <= WAIT_CHARS else why[:WAIT_CHARS - 1] + "…"
        lines.append(msg.waits_line(escape(view.id), view.kind, escape(view.pool), escape(why)))
    blocks: list[Block] = [SectionBlock(text="\n".join(lines))]
    if len(waits) > WAITS_SHOWN:
        blocks.append(context_block(escape(msg.more_waits(len(waits) - WAITS_SHOWN))))
    return blocks + [DividerBlock()]


def home_view(fleet_reply: Reply, waiting: list[RequestView], *, now: dt.datetime,
              notice: Reply | None = None, buttons: Sequence[Intent] = (),
              waits: list[tuple[RequestView, str]] | None = None,
              zone: dt.tzinfo = dt.timezone.utc) -> dict[str, Any]:
    """The Home tab for one user; `notice` (the outcome of their last click) on top;
    `buttons`: the request forms they may open (bot.request_forms.home_buttons); `waits`:
    the open requests that wait, with why; times in `zone` (the display zone)."""
    top: list[Block] = [HeaderBlock(text=PlainTextObject(text=msg.home_title(), emoji=True))]
    if notice is not None and (notice.summary or notice.title):
        top.append(context_block(escape(f"{header_text(notice)}: {notice.summary or ''}")))
    if buttons:
        top.extend(actions_blocks(list(buttons), block_id="request-drain"))
    pending = _waiting_blocks(waiting, now=now, zone=zone) + [DividerBlock()] + _waits_blocks(waits or [])
    footer = [context_block(escape(msg.home_updated_at(when(now, zone))))]
    status_title = SectionBlock(text=Mrkdwn(f"*{escape(fleet_reply.title)}*"))
    room = VIEW_BLOCKS - len(top) - len(pending) - len(footer) - 1
    status, _ = reply_blocks(fleet_reply, max_blocks=room, with_header=False)
    blocks = top + pending + [status_title] + status + footer
    return View(type="home", blocks=blocks).to_dict()
