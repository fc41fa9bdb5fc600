"""The HTTP endpoint against hostile and unlucky clients: bursts, silent and slow
clients, unsigned or malformed bodies, early hang-ups and chunked bodies. Every
request that should pass is really signed; the server is the real one, on a real port."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from bot.http_server import HttpSettings
from testenv.fakeslack import signing
from tests.e2e.conftest import CHANNEL, SECRET, HttpAnswer, send

BURST = 32


def _address(bot) -> tuple[str, int]:
    url = urllib.parse.urlsplit(bot.url)
    return url.hostname, url.port


def _silent_client(bot, *, announce_body: int = 100) -> socket.socket:
    """A client that sends the headers of a POST announcing a body, then nothing."""
    sock = socket.create_connection(_address(bot), timeout=10)
    sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: gpuops\r\nContent-Type: application/x-www-form-urlencoded"
                 b"\r\nContent-Length: " + str(announce_body).encode() + b"\r\n\r\n")
    return sock


def _closed_by_server(sock: socket.socket, *, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _records(caplog, level=logging.INFO) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= level]


# ------------------------------------------------------------------ load


def test_a_burst_of_concurrent_signed_commands_loses_none(http_bot):
    start = threading.Barrier(BURST)
    answers: list[HttpAnswer | Exception] = [None] * BURST  # type: ignore[list-item]

    def post(i: int) -> None:
        url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
        body = signing.slash_command_body(text="help", user_id="U0DAVE", response_url=url)
        start.wait(10)
        try:
            answers[i] = send(http_bot.url, body)
        except Exception as err:  # noqa: BLE001 - a lost request is what is counted
            answers[i] = err

    threads = [threading.Thread(target=post, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    lost = [a for a in answers if not isinstance(a, HttpAnswer) or a.status != 200]
    assert lost == []
    http_bot.deliveries.wait_for(lambda ds: len(ds) == BURST)


@pytest.mark.parametrize("http_settings", [HttpSettings(read_timeout=1, threads=2)])
def test_a_client_that_announces_a_body_and_sends_nothing_is_cut_off_and_holds_no_worker(http_bot):
    silent = [_silent_client(http_bot) for _ in range(4)]  # more than the server's threads
    try:
        # Meanwhile a real request is answered at once: waiting for a body holds no thread.
        assert send(http_bot.url, signing.slash_command_body(text="help", user_id="U0DAVE")).status == 200
        assert all(_closed_by_server(s, within=8) for s in silent)
        http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    finally:
        for s in silent:
            s.close()


@pytest.mark.parametrize("http_settings", [HttpSettings(max_connections=2, read_timeout=2)])
def test_past_the_connection_cap_new_clients_wait_until_a_connection_is_freed(http_bot):
    silent = [_silent_client(http_bot) for _ in range(2)]
    waiting = socket.create_connection(_address(http_bot), timeout=10)
    try:
        waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: gpuops\r\nConnection: close\r\n\r\n")
        waiting.settimeout(0.5)
        with pytest.raises(TimeoutError):
            waiting.recv(1024)  # not served while both connections are taken
        waiting.settimeout(8)
        assert waiting.recv(1024).startswith(b"HTTP/1.1 200")  # once the silent ones timed out
        assert all(_closed_by_server(s, within=1) for s in silent)
    finally:
        for s in (*silent, waiting):
            s.close()


# ------------------------------------------------------------------ verified before parsed


def test_a_malformed_unsigned_body_gets_401_and_one_log_line(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)

    answer = send(http_bot.url, b"payload=%7Bthis-is-not-json", secret="not-the-signing-secret-at-all")

    assert answer.status == 401
    (line,) = _records(caplog)
    assert line.name == "gpuops.bot.http" and "signature does not match" in line.getMessage()
    assert "Traceback" not in capfd.readouterr().err
    assert http_bot.deliveries.all() == []


def test_a_request_without_signature_headers_gets_401(http_bot, caplog):
    caplog.set_level(logging.INFO)
    request = urllib.request.Request(http_bot.url, data=b"command=%2Fgpu&text=status", method="POST")

    try:
        urllib.request.urlopen(request, timeout=10)
        status = 200
    except urllib.error.HTTPError as err:
        status = err.code

    assert status == 401
    assert [r.getMessage() for r in _records(caplog)] == [
        "refused a request to /slack/events from 127.0.0.1 with 401: it has no X-Slack-Signature or "
        "X-Slack-Request-Timestamp header"]


def test_a_timestamp_that_is_not_a_number_gets_401_not_a_failed_command(http_bot, caplog):
    caplog.set_level(logging.INFO)
    body = signing.slash_command_body(text="status", user_id="U0DAVE")

    answer = send(http_bot.url, body, headers={"X-Slack-Request-Timestamp": "soon"})

    assert answer.status == 401
    (line,) = _records(caplog)
    assert line.levelno == logging.WARNING and "not a number of seconds" in line.getMessage()
    assert http_bot.deliveries.all() == []


def test_a_signed_body_that_is_not_a_slack_payload_gets_400_and_one_log_line(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)

    answers = [send(http_bot.url, b"payload=%7Bthis-is-not-json"), send(http_bot.url, b"\xff\xfe not utf-8"),
               send(http_bot.url, b"[1, 2]", content_type=signing.JSON)]

    assert [a.status for a in answers] == [400, 400, 400]
    lines = [r.getMessage() for r in _records(caplog)]
    assert len(lines) == 3 and all("with 400: the signed body is not a Slack payload" in m for m in lines)
    assert "Traceback" not in capfd.readouterr().err


def test_a_forged_body_is_never_written_to_the_log(http_bot, caplog):
    caplog.set_level(logging.DEBUG)
    forged = b"text=" + b"A" * (512 * 1024) + b"&token=" + b"B" * 40

    answer = send(http_bot.url, forged, secret="not-the-signing-secret-at-all")

    assert answer.status == 401
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert len(logged) < 1000 and "AAAA" not in logged and "BBBB" not in logged


def test_a_client_that_hangs_up_mid_body_leaves_no_trace_in_the_log(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)
    body = signing.slash_command_body(text="status", user_id="U0DAVE")
    signed = signing.sign(body, secret=SECRET, timestamp=int(time.time()))
    sock = socket.create_connection(_address(http_bot), timeout=10)
    sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: gpuops\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in signed.items()) + b"\r\n" + body[:10])
    sock.close()

    # The server goes on serving, and said nothing about the hang-up.
    assert send(http_bot.url, signing.slash_command_body(text="help", user_id="U0DAVE")).status == 200
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    assert _records(caplog) == []
    assert "Traceback" not in capfd.readouterr().err


# ------------------------------------------------------------------ framing


def test_a_chunked_signed_body_is_read_whole_and_the_next_request_on_the_connection_is_its_own(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
    body = signing.slash_command_body(text="status", user_id="U0DAVE", response_url=url)
    headers = {**signing.sign(body, secret=SECRET, timestamp=int(time.time())), "Content-Type": signing.FORM}
    connection = http.client.HTTPConnection(*_address(http_bot), timeout=10)
    try:
        connection.request("POST", "/slack/events", body=iter([body[:40], body[40:]]), headers=headers,
                           encode_chunked=True)
        first = connection.getresponse()
        assert (first.status, first.read()) == (200, b"")
        connection.request("GET", "/healthz")
        second = connection.getresponse()
        assert (second.status, second.read()) == (200, b"ok\n")
    finally:
        connection.close()
    assert "GPU fleet status" in http_bot.slack.wait_for_response(url).body["text"]


def test_healthz_answers_on_the_same_server_and_other_paths_are_not_found(http_bot):
    base = http_bot.url.rsplit("/slack", 1)[0]
    with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
        assert (answer.status, answer.read()) == (200, b"ok\n")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/metrics", timeout=5)
    assert missing.value.code == 404
