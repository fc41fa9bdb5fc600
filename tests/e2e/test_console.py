"""The console as a person (or a script) uses it: commands typed, replies read as text,
buttons clicked by number, identities switched. The same dispatcher and click handler as
Slack, so the same roles and the same two-person rule."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from freezegun import freeze_time

from bot.console import run_console
from bot.render_text import render_text
from commands.handover import handover_message
from commands.reply import Reply
from tests.e2e.harness import ROOT, a_plan, submit_upgrade
from workflows.handover.service import HandoverService

START = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


def console(runtime, script: str, *, as_user: str = "U0DAVE") -> tuple[int, str]:
    out = io.StringIO()
    code = run_console(script.strip().splitlines(), runtime=runtime, out=out, as_user=as_user)
    return code, out.getvalue()


def test_a_viewer_reads_fleet_status_as_text(runtime):
    code, transcript = console(runtime, "/gpu status")

    assert code == 0
    assert "gpuops console as dave (U0DAVE, viewer)" in transcript
    assert "dave> /gpu status\nGPU fleet status\n================" in transcript
    assert "9 GPU nodes Ready" in transcript and "serving-a" in transcript


def test_an_unknown_command_gets_the_closest_match_and_a_failing_exit_code(runtime):
    code, transcript = console(runtime, "/gpu findngs")

    assert code == 1
    assert "Unknown command: findngs (failed)" in transcript and "Did you mean `/gpu findings`?" in transcript


def test_the_two_person_rule_holds_in_the_console_as_in_slack(runtime):
    request = submit_upgrade(runtime, by="U0ERIN")

    code, transcript = console(runtime, f"""
/gpu request {request.id}
:as U0BOB
/gpu request {request.id}
1
1
:as U0CAROL
1
""", as_user="U0ERIN")

    assert code == 0
    # erin, admin and approver, is offered no Approve on her own request: only Cancel.
    erin_sees = transcript[:transcript.index(":as U0BOB")]
    assert "[1] Cancel request (asks to confirm)" in erin_sees and "Approve" not in erin_sees.split("Plan ")[-1]
    assert "[1] Approve\n[2] Deny (asks to confirm)" in transcript
    assert "Now acting as bob (U0BOB, approver, viewer, approver of inference-mig, approver of serving-a)." in transcript
    assert f"Done: You approved {request.id} (1 of 2)." in transcript
    assert f"Not done: You already approved {request.id}" in transcript  # bob's second click
    assert f"Done: You approved {request.id}: it has all 2 approvals it needs." in transcript
    assert runtime.services().requests.get(request.id).state == "approved"


def test_deny_in_the_console_asks_to_confirm_then_for_the_reason(runtime):
    request = submit_upgrade(runtime)

    code, transcript = console(runtime, f"""
/gpu request {request.id}
2
no
2
yes
the capacity floor of serving-a is reached
""", as_user="U0CAROL")

    assert "Deny this request? The request ends" in transcript
    assert "Nothing done." in transcript
    assert f"Why do you deny {request.id}?" in transcript
    assert f"Done: You denied {request.id}" in transcript
    assert "carol denied plan" in transcript and "the capacity floor of serving-a is reached" in transcript
    assert runtime.services().requests.get(request.id).state == "denied"


def test_a_viewer_is_offered_no_buttons_on_a_request_in_the_console(runtime):
    request = submit_upgrade(runtime)

    code, transcript = console(runtime, f"/gpu request {request.id}\n1")

    assert "There is no button 1: the last reply has none." in transcript
    assert "Approve" not in transcript.split("Plan ")[-1]


def test_approving_after_the_deadline_says_when_it_expired(runtime):
    # The kubernetes client builds its models lazily, which freezegun's module scan would trigger.
    with freeze_time(START, ignore=["kubernetes"]) as clock:
        request = submit_upgrade(runtime, now=START)
        clock.tick(dt.timedelta(hours=25))
        code, transcript = console(runtime, f"/gpu request {request.id}\n/gpu approve {request.id} {request.short_hash}",
                                   as_user="U0BOB")

    assert code == 1
    assert "[1] Approve" not in transcript  # past its deadline, nothing is offered
    # In the display zone: the configuration's first rotation is Berlin's (CEST in June).
    assert f"{request.id} expired at 2025-06-08 14:00 CEST before it had enough approvals" in transcript


def test_console_commands_help_and_unknown_ones(runtime):
    code, transcript = console(runtime, ":help\n:frobnicate\n7")

    assert "Console commands:" in transcript and "Unknown console command ':frobnicate'" in transcript
    assert "There is no button 7" in transcript


# ------------------------------------------------------------------ the real command line


def _gpuops(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    return subprocess.run([str(Path(sys.executable).with_name("gpuops")), *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, env={**clean, **(env or {})}, timeout=60)


def test_gpuops_console_help_explains_the_identity_and_the_script_mode():
    result = _gpuops("console", "--help")

    assert result.returncode == 0
    assert "--as SLACK_USER_ID" in result.stdout and "stdin" in result.stdout


def test_gpuops_run_without_or_with_malformed_tokens_says_which_and_exits_2():
    missing = _gpuops("run")
    wrong_kind = _gpuops("run", env={"SLACK_BOT_TOKEN": "xoxp-a-user-token", "SLACK_APP_TOKEN": "xapp-1"})
    no_secret = _gpuops("run", "--http", env={"SLACK_BOT_TOKEN": "xoxb-1-2-secretpart"})

    assert [r.returncode for r in (missing, wrong_kind, no_secret)] == [2, 2, 2]
    assert "SLACK_BOT_TOKEN is not set" in missing.stderr
    assert "must be a token starting with 'xoxb-', but it starts with 'xoxp-'" in wrong_kind.stderr
    assert "SLACK_SIGNING_SECRET is not set" in no_secret.stderr
    for result in (missing, wrong_kind, no_secret):
        assert "Traceback" not in result.stderr and "secretpart" not in result.stderr + result.stdout


def test_gpuops_run_reads_tokens_from_files_and_reports_a_token_slack_refuses(slack, tmp_path):
    token_file = tmp_path / "bot-token"
    token_file.write_text("xoxb-revoked-secretpart\n")

    result = _gpuops("run", env={"SLACK_BOT_TOKEN_FILE": str(token_file), "SLACK_APP_TOKEN": slack.app_token,
                                 "SLACK_API_URL": slack.base_url})

    assert result.returncode == 2
    assert "Slack refused SLACK_BOT_TOKEN (invalid_auth)" in result.stderr
    assert "Traceback" not in result.stderr and "secretpart" not in result.stderr


def test_gpuops_audit_verify_and_export_a_sound_log_then_name_the_entry_someone_changed(runtime, tmp_path):
    submit_upgrade(runtime)
    database = str(runtime.database.path)
    runtime.close()

    sound = _gpuops("audit", "verify", "--database", database)
    exported = _gpuops("audit", "export", "--output", str(tmp_path / "audit.jsonl"), "--database", database)
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    raw = sqlite3.connect(database)
    raw.execute("DROP TRIGGER audit_no_update")
    raw.execute("UPDATE audit SET actor = 'U0MALLORY' WHERE seq = 1")
    raw.commit()
    raw.close()
    broken = _gpuops("audit", "verify", "--database", database)

    assert sound.returncode == 0 and "The audit log is intact: 1 entry" in sound.stdout
    assert exported.returncode == 0 and "Exported 1 audit entry" in exported.stderr
    assert [json.loads(line)["action"] for line in lines] == ["request.created"]
    assert broken.returncode == 1 and "The audit log is BROKEN at entry 1" in broken.stdout


def test_gpuops_audit_on_a_missing_database_says_where_it_looked(tmp_path):
    result = _gpuops("audit", "verify", "--database", str(tmp_path / "nothing.db"))

    assert result.returncode == 2 and "There is no gpuops database at" in result.stderr


def test_unicode_digits_get_usage_not_a_crash(runtime):
    request = submit_upgrade(runtime, by="U0ERIN")

    code, transcript = console(runtime, f"""
/gpu request {request.id}
²
/gpu audit ²
/gpu handover history ²
/gpu status
""", as_user="U0BOB")

    assert code == 0  # the console lived to run the last line
    assert "bob> ²\nThere is no button ²: choose 1 to 2." in transcript
    assert "bob> /gpu audit ²\nUsage" in transcript and "digits 0-9, e.g. `/gpu audit 50`" in transcript
    assert "bob> /gpu handover history ²\nUsage" in transcript and "(digits 0-9, e.g. 20)" in transcript
    assert "bob> /gpu status\nGPU fleet status" in transcript
    # Nothing was clicked: the request still waits for both approvals.
    assert runtime.services().requests.get(request.id).approvals_counted == 0


def test_a_truncated_log_with_its_anchor_moved_is_caught_by_the_requests_it_no_longer_names_and_the_published_head(
        runtime, small_fleet):
    for _ in range(2):
        submit_upgrade(runtime)
    services = runtime.services()
    rotation = services.config.rotations[0]
    shift = rotation.incoming_shift(rotation.next_shift_change(START))
    handovers = HandoverService(services.database, services.config)
    view = handovers.post(rotation, shift.start, handovers.checklist(rotation, shift, fleet=small_fleet, now=START),
                          late=False, now=START)
    posted = render_text(handover_message(view, services.config))  # what the channel reads
    head = re.search(r"Audit chain head (\d+):([0-9a-f]{64}) \(`gpuops audit verify --expected", posted)
    assert head is not None and head.group(1) == "2"
    submit_upgrade(runtime)  # the log grows after the post
    database = str(runtime.database.path)
    runtime.close()
    intact = _gpuops("audit", "verify", "--expected", f"2:{head.group(2)}", "--database", database)

    # Someone with the file drops every row from 2 on and moves the anchor to row 1.
    raw = sqlite3.connect(database)
    raw.execute("DROP TRIGGER audit_no_delete")
    raw.execute("DELETE FROM audit WHERE seq >= 2")
    (first,) = raw.execute("SELECT hash FROM audit WHERE seq = 1").fetchone()
    raw.execute("UPDATE kv SET value = ? WHERE key = 'audit.head'", (json.dumps({"seq": 1, "hash": first}),))
    raw.commit()
    raw.close()
    alone = _gpuops("audit", "verify", "--database", database)
    against = _gpuops("audit", "verify", "--expected", f"2:{head.group(2)}", "--database", database)

    assert intact.returncode == 0 and "It holds the published head 2:" in intact.stdout
    assert "Its head now: 4:" in intact.stdout
    # The chain and the anchor agree; the requests whose rows went tell.
    assert alone.returncode == 1 and "but no audit row mentions it: its rows were wiped" in alone.stdout
    assert against.returncode == 1 and "The audit log is BROKEN at entry 2" in against.stdout
    assert "the head published earlier is row 2, but the log ends at row 1" in against.stdout


def test_a_log_wiped_with_its_anchor_beside_requests_and_approvals_is_broken_and_offers_no_head_to_keep(runtime):
    request = submit_upgrade(runtime)
    services = runtime.services()
    services.requests.approve(services.config.actor("U0BOB"), request.id, plan_hash=request.plan_hash,
                              now=dt.datetime.now(dt.timezone.utc))
    database = str(runtime.database.path)
    runtime.close()

    # Someone with the file deletes every row and the anchor: what is left is an empty chain.
    raw = sqlite3.connect(database)
    raw.execute("DROP TRIGGER audit_no_delete")
    raw.execute("DELETE FROM audit")
    raw.execute("DELETE FROM kv WHERE key = 'audit.head'")
    raw.commit()
    raw.close()
    result = _gpuops("audit", "verify", "--database", database)

    assert result.returncode == 1 and "The audit log is BROKEN" in result.stdout
    assert f"request {request.id} is pending but no audit row mentions it" in result.stdout
    assert "0" * 64 not in result.stdout and "Its head now" not in result.stdout


def test_gpuops_audit_verify_refuses_an_expected_head_it_cannot_read(runtime):
    database = str(runtime.database.path)
    runtime.close()

    result = _gpuops("audit", "verify", "--expected", "42:not-a-hash", "--database", database)

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--expected: '42:not-a-hash' is not an audit head: it is SEQ:HASH" in result.stderr


def test_escape_sequences_in_a_reason_never_reach_the_terminal(runtime):
    services = runtime.services()
    hostile = "fix\x1b[2J\x1b[1;1H\x1b[32mAPPROVED BY ERIN\x1b[0m\x1b]0;owned\x07\r\x08 \x1b]8;;https://evil\x1b\\link"
    request = services.requests.submit(
        runtime.config.actor("U0ALICE"), kind="upgrade", pool="serving-a", targets=["serving-a-000"],
        plan=a_plan(), window_start=None, window_end=None, reason=hostile, now=dt.datetime.now(dt.timezone.utc))

    code, transcript = console(runtime, f"/gpu request {request.id}\n/gpu requests", as_user="U0BOB")

    assert code == 0
    assert not any(c in transcript for c in "\x1b\x07\r\x08\x9b")
    assert "fixAPPROVED BY ERIN" in transcript and "link" in transcript
    assert "https://evil" not in transcript


def test_text_for_a_terminal_keeps_what_it_says_and_drops_what_would_act_on_the_terminal():
    reply = Reply(title="Request req-1 \x1b[31mred\x1b[0m", summary="line one\nline\ttwo\r\x7f\u202eevil",
                  visibility="ephemeral")

    text = render_text(reply)

    assert text.startswith("Request req-1 red\n")
    assert "line one\nline\ttwo\ufffd\ufffd\ufffdevil" in text


def test_leaving_the_console_with_a_run_in_flight_says_its_engine_stops_with_it(runtime):
    request = submit_upgrade(runtime, by="U0ERIN")
    for approver in ("U0BOB", "U0CAROL"):
        runtime.services().requests.approve(runtime.config.actor(approver), request.id,
                                            plan_hash=request.plan_hash, now=dt.datetime.now(dt.timezone.utc))
    run = runtime.services().runs.start(request.id, dry_run=False, now=dt.datetime.now(dt.timezone.utc))

    _, transcript = console(runtime, "/gpu requests\n:quit\n", as_user="U0ERIN")

    assert f"Runs still in flight: {run.id}. Their engine stops with this console" in transcript
    runtime.services().runs.abort(runtime.config.actor("U0ERIN"), run.id, now=dt.datetime.now(dt.timezone.utc))
    _, after = console(runtime, ":quit\n", as_user="U0ERIN")
    assert "Runs still in flight" not in after
