"""Every command's answer fits Slack's limits on a fleet far too large for one message
(300 GPU nodes, 200 findings). The fake Web API refuses anything Slack would refuse, so
an answer that arrives is one Slack would show. What is cut says so, and the full text
is uploaded as a file the answer links to."""

from __future__ import annotations

import pytest

from testenv.fakeslack import signing
from tests.e2e.harness import CHANNEL, send, text_of


@pytest.fixture
def fleet_source(large_fleet):
    from tests.e2e.harness import StaticFleet

    return StaticFleet(large_fleet)


COMMANDS = ["status", "status serving-a", "status training-a", "findings", "findings serving-a",
            "node serving-a-000", "help", "help findings", "stauts", "node", "findings cluster"]


@pytest.mark.parametrize("text", COMMANDS)
def test_every_answer_is_within_slacks_limits(http_bot, text):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text=text, user_id="U0DAVE", response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok, post.response
    assert len(post.body["blocks"]) <= 50 and len(post.body["text"]) <= 4000


def test_a_pool_of_100_nodes_is_cut_with_a_count_and_its_full_text_uploaded_to_the_users_dm(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a", user_id="U0DAVE", response_url=url))

    post = http_bot.slack.wait_for_response(url)
    text = text_of(post.body["blocks"])
    assert "more findings_" in text and "the full text is in <https://" in text
    (upload,) = http_bot.slack.workspace.files()
    assert upload.completed and upload.channel == http_bot.slack.last("conversations.open").response["channel"]["id"]
    full = upload.content.decode()
    assert all(f"serving-a-{i:03d}" in full for i in range(0, 300, 3))
    assert upload.filename == "gpuops-gpu-pool-serving-a.txt"


def test_two_hundred_findings_are_cut_and_counted_and_none_is_lost_in_the_file(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="findings", user_id="U0DAVE", response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert "more findings_" in text_of(post.body["blocks"])
    (upload,) = http_bot.slack.workspace.files()
    assert upload.content.decode().count("[WARNING]") == 200


def test_when_no_file_can_be_uploaded_the_cut_answer_still_arrives_and_says_it_was_cut(http_bot):
    http_bot.slack.fail_next("files.getUploadURLExternal", "missing_scope", status=200, times=2)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="findings", user_id="U0DAVE", response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok and "Too long for one message, so some rows are left out" in text_of(post.body["blocks"])


def test_the_home_tab_of_a_large_fleet_fits_in_100_blocks(http_bot):
    send(http_bot.url, signing.app_home_opened_body("U0DAVE"), content_type=signing.JSON)

    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    published = http_bot.slack.last("views.publish")
    assert published.ok, published.response
    assert len(published.args["view"]["blocks"]) <= 100
