"""Log lines as a collector reads them: JSON with the request, run, step and node a line is
about as fields, secrets redacted in the message and in a traceback; text on a terminal."""

from __future__ import annotations

import io
import json
import logging

import pytest

from bot.logs import _JsonLines, _LogFields, RedactSecrets, JSON_FIELDS, JSON_NAMES, log_format
from workflows import logfields

SECRET = "xoxb-1234-marker-secret"


@pytest.fixture
def lines():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_JsonLines(list(JSON_FIELDS), rename_fields=JSON_NAMES))
    handler.addFilter(_LogFields())
    handler.addFilter(RedactSecrets([SECRET]))
    logger = logging.getLogger("gpuops.test.lines")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    logger.removeHandler(handler)


def test_a_line_carries_the_ids_it_is_about_and_only_inside_their_scope(lines):
    logger, read = lines
    with logfields.bound(request_id="req-1", run_id="run-2"):
        with logfields.bound(step_id=7, node="gpu-01", run_id=None):
            logger.info("cordoned %s", "gpu-01")
        logger.warning("wave 2 waits")
    logger.info("outside")

    first, second, third = read()
    assert (first["level"], first["logger"], first["message"]) == ("INFO", "gpuops.test.lines", "cordoned gpu-01")
    assert {k: first[k] for k in ("request_id", "run_id", "step_id", "node")} == {
        "request_id": "req-1", "run_id": "run-2", "step_id": "7", "node": "gpu-01"}
    assert "step_id" not in second and second["run_id"] == "run-2"
    assert "run_id" not in third and "time" in third


def test_secrets_are_redacted_from_the_message_and_the_traceback(lines):
    logger, read = lines
    try:
        raise RuntimeError(f"Slack said no to {SECRET}")
    except RuntimeError:
        logger.exception("posting with %s failed", SECRET)

    (line,) = read()
    assert SECRET not in json.dumps(line)
    assert line["message"] == "posting with [redacted] failed"
    assert "RuntimeError: Slack said no to [redacted]" in line["exc_info"]


def test_the_format_is_text_on_a_terminal_json_elsewhere_or_as_asked(monkeypatch):
    monkeypatch.delenv("GPUOPS_LOG_FORMAT", raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert log_format() == "text"
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert log_format() == "json"
    monkeypatch.setenv("GPUOPS_LOG_FORMAT", "text")
    assert log_format() == "text"
    monkeypatch.setenv("GPUOPS_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="GPUOPS_LOG_FORMAT is 'xml': it is json, text or auto"):
        log_format()
