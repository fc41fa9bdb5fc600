"""Replies rendered as Block Kit stay within every limit Slack enforces (checked by the
same rules the fake Slack refuses with), escape user text for mrkdwn, cut long parts
at row boundaries saying how much was left out, and put a confirmation on every
destructive button. The text rendering for the console shows everything."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.render_blocks import FileLink, render_blocks
from bot.render_text import render_text
from commands.reply import Confirm, Fact, Intent, Notice, Reply, Section, Table
from testenv.fakeslack import blockkit

HOSTILE = "a&b <!channel> <@U0BOSS> <https://evil.example|click> x>y"


def texts(blocks: list[dict]) -> list[str]:
    found: list[str] = []

    def walk(value):
        if isinstance(value, dict):
            if value.get("type") in ("mrkdwn", "plain_text"):
                found.append(value["text"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(blocks)
    return found


def mrkdwn_texts(blocks: list[dict]) -> list[str]:
    found: list[str] = []

    def walk(value):
        if isinstance(value, dict):
            if value.get("type") == "mrkdwn":
                found.append(value["text"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(blocks)
    return found


def node_table(rows: int) -> Table:
    return Table(columns=("node", "ready", "driver"),
                 rows=tuple((f"gpu-{i:04d}", "Ready", "580.95.05") for i in range(rows)))


def test_user_text_is_escaped_for_mrkdwn_everywhere_it_appears():
    reply = Reply(title=HOSTILE, summary=HOSTILE, footer=HOSTILE, sections=(
        Section(title=HOSTILE, text=HOSTILE, facts=(Fact(HOSTILE, HOSTILE),),
                notices=(Notice("critical", HOSTILE, command=HOSTILE),), bullets=(HOSTILE,),
                table=Table(columns=("c",), rows=((HOSTILE,),))),))

    rendered = render_blocks(reply)

    for text in mrkdwn_texts(rendered.blocks) + [rendered.text]:
        assert "<!channel>" not in text and "<@U0BOSS>" not in text and "<https://" not in text
        assert "a&amp;b &lt;!channel&gt;" in text or "a&amp;b" in text
    assert rendered.blocks[0]["text"]["text"] == HOSTILE  # a header is plain text: shown as typed


def test_a_table_of_a_thousand_rows_is_cut_at_a_row_with_the_count_left_out():
    rendered = render_blocks(Reply(title="Nodes", sections=(Section(title="Nodes", table=node_table(1000)),)))

    code = [t for t in mrkdwn_texts(rendered.blocks) if "```" in t]
    assert 1 <= len(code) <= 3 and all(len(t) <= 3000 for t in code)
    shown = sum(t.count("gpu-") for t in code)
    assert f"…and {1000 - shown} more rows" in code[-1]
    # each block is one code block that starts with the header
    assert all(t.count("```") == 2 and t.split("```")[1].startswith("node      ready  driver\n") for t in code)
    assert rendered.truncated
    assert "some rows are left out" in mrkdwn_texts(rendered.blocks)[-1]


def test_a_few_columns_of_prose_read_as_a_list_not_a_wrapped_code_block():
    help_table = Table(columns=("command", "what it does", "role"), rows=(
        ("/gpu status [pool]", "Every pool at a glance, findings first; or one pool's nodes " * 2, "viewer"),
        ("/gpu node <name>", "One GPU node in full", "viewer")))

    (block,) = [b for b in render_blocks(Reply(title="help", sections=(Section(table=help_table),))).blocks
                if b["type"] == "section"]

    assert "```" not in block["text"]["text"]
    assert block["text"]["text"].splitlines()[1] == "`/gpu node &lt;name&gt;` — One GPU node in full · _viewer_"


def test_when_the_full_text_was_uploaded_the_message_links_to_it():
    rendered = render_blocks(Reply(title="Nodes", sections=(Section(table=node_table(1000)),)),
                             full_text=FileLink("https://files.example/F1/gpuops-nodes.txt", "gpuops-nodes.txt"))

    assert mrkdwn_texts(rendered.blocks)[-1].endswith(
        "the full text is in <https://files.example/F1/gpuops-nodes.txt|gpuops-nodes.txt>.")


def test_many_long_facts_become_at_most_ten_fields_a_section_each_within_2000_characters():
    facts = tuple(Fact(f"fact {i}", "x" * 5000) for i in range(30))

    rendered = render_blocks(Reply(title="Facts", sections=(Section(facts=facts),)))

    sections = [b for b in rendered.blocks if b.get("fields")]
    assert len(sections) == 2 and all(len(b["fields"]) == 10 for b in sections)
    assert all(len(f["text"]) <= 2000 and f["text"].endswith("…") for b in sections for f in b["fields"])
    assert rendered.truncated


def test_sixty_sections_fit_in_fifty_blocks_and_keep_their_buttons_and_footer():
    reply = Reply(title="t" * 400, summary="s", footer="see `/gpu help`",
                  sections=tuple(Section(title=f"part {i}", text="body") for i in range(60)),
                  intents=(Intent("approve", "Approve", "req-abc123/" + "a" * 64, style="primary"),))

    rendered = render_blocks(reply)

    assert len(rendered.blocks) == 50 and rendered.truncated
    assert len(rendered.blocks[0]["text"]["text"]) <= 150
    assert rendered.blocks[-2]["type"] == "actions" and rendered.blocks[-1]["type"] == "context"
    assert blockkit.message_errors(blocks=rendered.blocks) == []


def test_deny_cancel_abort_and_roll_back_ask_for_confirmation_and_approve_does_not():
    intents = (Intent("approve", "Approve", "req-1"), Intent("deny", "Deny", "req-1"),
               Intent("cancel", "Cancel request", "req-1"), Intent("abort", "Abort run", "run-1"),
               Intent("ack", "L" * 120, "h-1", confirm=Confirm("Sure?", "It stays done.")),
               Intent("rollback", "Roll back", "run-1"))

    (actions,) = [b for b in render_blocks(Reply(title="r", intents=intents)).blocks if b["type"] == "actions"]

    buttons = {e["action_id"]: e for e in actions["elements"]}
    assert "confirm" not in buttons["gpuops.approve.0"]
    for action_id in ("gpuops.deny.1", "gpuops.cancel.2", "gpuops.abort.3"):
        assert buttons[action_id]["confirm"]["style"] == "danger"
    assert buttons["gpuops.ack.4"]["confirm"]["title"]["text"] == "Sure?"
    assert len(buttons["gpuops.ack.4"]["text"]["text"]) <= 75
    assert buttons["gpuops.rollback.5"]["confirm"]["title"]["text"] == "Roll back this run?"


def test_a_failed_reply_says_so_once_and_its_underline_fits_what_is_written():
    unknown = render_text(Reply(title="Unknown command: findngs", ok=False)).splitlines()
    refused = render_text(Reply(title="Refused", summary="no", ok=False)).splitlines()

    assert unknown[:2] == ["Unknown command: findngs (failed)", "=" * len("Unknown command: findngs (failed)")]
    assert refused[:2] == ["Refused", "======="]  # not "Refused (failed)"


def test_the_text_rendering_shows_every_row_and_numbers_the_buttons():
    reply = Reply(title="Nodes", sections=(Section(table=node_table(1000)),),
                  intents=(Intent("approve", "Approve", "req-1"), Intent("deny", "Deny", "req-1")))

    text = render_text(reply)

    assert text.count("gpu-") == 1000 and "& " not in text
    assert "[1] Approve\n[2] Deny (asks to confirm)" in text


line = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)


@st.composite
def replies(draw) -> Reply:
    def section() -> Section:
        columns = draw(st.integers(1, 6))
        rows = draw(st.lists(st.tuples(*[line] * columns), max_size=draw(st.sampled_from([0, 5, 400]))))
        return Section(
            title=draw(st.none() | line), text=draw(st.none() | st.text(max_size=5000)),
            facts=tuple(draw(st.lists(st.builds(Fact, line, st.text(max_size=3000)), max_size=25))),
            notices=tuple(draw(st.lists(st.builds(Notice, st.sampled_from(["critical", "warning", "info"]), line),
                                        max_size=draw(st.sampled_from([3, 300]))))),
            bullets=tuple(draw(st.lists(line, max_size=50))),
            table=Table(columns=tuple(f"c{i}" for i in range(columns)), rows=tuple(rows)) if rows else None)

    sections = tuple(section() for _ in range(draw(st.integers(0, 12))))
    intents = tuple(Intent(draw(st.sampled_from(["approve", "deny", "cancel"])), draw(line) or "b", f"req-{i}")
                    for i in range(draw(st.integers(0, 4))))
    return Reply(title=draw(line) or "t", summary=draw(st.none() | st.text(max_size=4000)), sections=sections,
                 intents=intents, footer=draw(st.none() | line))


@settings(max_examples=80, deadline=None)
@given(replies())
def test_any_reply_renders_to_a_message_slack_accepts(reply):
    rendered = render_blocks(reply)

    assert blockkit.message_errors(blocks=rendered.blocks) == []
    assert len(rendered.text) <= 4000


def test_gpu_help_fits_a_100_column_terminal():
    import datetime as dt

    from commands.catalog import dispatch
    from commands.services import Services
    from workflows.config import GpuopsConfig

    config = GpuopsConfig.model_validate({"access": {"users": {"U0ERIN": ["admin"]}}})
    reply = dispatch("help", actor=config.actor("U0ERIN"), services=Services(config=config, fleet=None),  # type: ignore[arg-type]
                     now=dt.datetime(2026, 12, 5, tzinfo=dt.timezone.utc))

    lines = render_text(reply).splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert any(line.startswith("/gpu migrate ") for line in lines)
