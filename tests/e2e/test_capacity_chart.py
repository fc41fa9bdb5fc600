"""`/gpu status <pool> --chart`: the leader samples each pool's capacity (its scheduler's
capacity job), and the chart of the last day goes with the status answer: in Slack as a
PNG uploaded where the answer is seen (the fake Slack enforces the upload API), in the
console as a file whose path it prints. An upload Slack refuses leaves the answer as it is."""

from __future__ import annotations

import datetime as dt
import io

from bot.console import run_console
from bot.scheduler import sample_capacity
from storage import capacity
from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, send, text_of

UTC = dt.timezone.utc
PNG = b"\x89PNG\r\n\x1a\n"


def sampled_for_a_day(runtime) -> None:
    """The capacity job as the leader runs it, every hour over the last day."""
    now = dt.datetime.now(UTC)
    for hours in range(24, -1, -1):
        sample_capacity(runtime, now - dt.timedelta(hours=hours))


def test_the_leaders_samples_hold_each_pools_gpus_advertised_and_out(runtime):
    sampled_for_a_day(runtime)

    samples = capacity.of_pool(runtime.database.get(), cluster=runtime.config.cluster_name or "", pool="serving-a",
                               since=dt.datetime.now(UTC) - dt.timedelta(days=2))
    fleet = runtime.services().fleet.fleet(dt.datetime.now(UTC))
    pool = fleet.pool("serving-a")
    assert len(samples) == 25
    assert {(s.advertised, s.out) for s in samples} == {(pool.gpus_advertised, 0)}


def test_status_with_chart_answers_as_usual_and_uploads_the_pools_capacity_to_the_users_dm(http_bot):
    sampled_for_a_day(http_bot.runtime)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a --chart", user_id="U0DAVE",
                                                  response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok and "serving-a" in text_of(post.body["blocks"])
    http_bot.slack.wait_for("files.completeUploadExternal")
    (upload,) = http_bot.slack.workspace.files()
    assert upload.completed and upload.channel == http_bot.slack.last("conversations.open").response["channel"]["id"]
    assert upload.filename == "serving-a-capacity.png" and "serving-a" in (upload.title or "")
    assert upload.content is not None and upload.content.startswith(PNG) and 10_000 < len(upload.content) < 500_000


def test_status_without_chart_uploads_nothing(http_bot):
    sampled_for_a_day(http_bot.runtime)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a", user_id="U0DAVE", response_url=url))

    assert http_bot.slack.wait_for_response(url).ok
    assert not http_bot.slack.calls("files.getUploadURLExternal")


def test_a_chart_slack_refuses_to_take_leaves_the_answer_intact(http_bot):
    http_bot.slack.fail_next("files.getUploadURLExternal", "missing_scope", status=200)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a --chart", user_id="U0DAVE",
                                                  response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok and "serving-a" in text_of(post.body["blocks"])
    assert http_bot.slack.wait_for("files.getUploadURLExternal").error == "missing_scope"
    assert not [f for f in http_bot.slack.workspace.files() if f.completed]


def test_chart_without_a_pool_says_to_name_one(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status --chart", user_id="U0DAVE", response_url=url))

    assert "name the pool" in text_of(http_bot.slack.wait_for_response(url).body["blocks"])


def test_the_console_writes_the_chart_to_a_file_and_prints_its_path(runtime, tmp_path):
    sampled_for_a_day(runtime)
    out = io.StringIO()

    code = run_console(["/gpu status serving-a --chart"], runtime=runtime, out=out, as_user="U0DAVE",
                       pictures=tmp_path)

    path = tmp_path / "serving-a-capacity.png"
    assert code == 0 and f"Picture saved to {path}" in out.getvalue()
    assert path.read_bytes().startswith(PNG)
