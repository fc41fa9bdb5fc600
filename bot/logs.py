"""Logging for the gpuops process, with secrets redacted.

slack_sdk already hides the Authorization header in its debug logs, but a token can
still reach a log line another way (an exception's repr, a URL, a misconfigured env
dump). So every handler gets a filter that replaces the configured secrets (also as
they read URL-encoded), anything shaped like a Slack token, the values of `token` and
`response_url` fields (in JSON, a form, or JSON URL-encoded inside a form's `payload`)
and Slack's hook URLs with `[redacted]` before the record is written. A response_url
lets anyone who holds it post as the app for half an hour.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import urllib.parse
from collections.abc import Iterable

from pythonjsonlogger.json import JsonFormatter

from workflows import logfields

REDACTED = "[redacted]"
_TOKEN_SHAPED = re.compile(r"\bx(?:ox[abposre]|app)-[A-Za-z0-9-]+")
# Slack payloads still carry the legacy verification token as a `token` field, and bolt
# logs a request's body in some of its lines. The field may be JSON (`"token": "x"`), a
# form (`token=x`) or JSON URL-encoded in a form (`%22token%22%3A%22x%22`).
_QUOTE = r"""(?:["']|%22|%27)"""
# Spaces around the colon, as they read URL-encoded too (`%20`, or `+` in a form).
_SPACE = r"""(?:\s|%20|\+)*"""
_FIELD_VALUE = r"""(?:(?!%22|%27|%26|%2C|%7D)[^&"'\s,}])+"""
_SECRET_FIELD = re.compile(
    rf"""((?:\b|(?<=%22)|(?<=%27))(?:token|response_url){_QUOTE}?{_SPACE}(?:[:=]|%3A|%3D){_SPACE}{_QUOTE}?)"""
    + _FIELD_VALUE, re.IGNORECASE)
# A hook URL (response_url, incoming webhook, workflow trigger) wherever it stands.
_HOOK_URL = re.compile(rf"""hooks\.slack\.com(?:/|%2F){_FIELD_VALUE}""", re.IGNORECASE)


class RedactSecrets(logging.Filter):
    """Rewrites a record's message (arguments merged in) with secrets masked."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        secrets = {s for s in secrets if s}
        self._given = tuple(secrets)
        spelled = secrets | {urllib.parse.quote(s, safe="") for s in secrets} | {
            urllib.parse.quote_plus(s, safe="") for s in secrets}
        self._secrets = sorted(spelled, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        text = _TOKEN_SHAPED.sub(REDACTED, text)
        text = _HOOK_URL.sub("hooks.slack.com/" + REDACTED, text)
        return _SECRET_FIELD.sub(lambda m: m.group(1) + REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        cleaned = self.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# JSON lines: these fields first, then the ids the line is about (`workflows.logfields`).
JSON_FIELDS = ("asctime", "levelname", "name", "message")
JSON_NAMES = {"asctime": "time", "levelname": "level", "name": "logger"}


class _JsonLines(JsonFormatter):
    """python-json-logger's formatter, writing the traceback `RedactSecrets` already
    cleaned (`exc_text`) rather than formatting the exception again from scratch."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and record.exc_text:
            saved, record.exc_info = record.exc_info, None
            try:
                return super().format(record)
            finally:
                record.exc_info = saved
        return super().format(record)


class _LogFields(logging.Filter):
    """Puts the request, run, step and node a line is about on the record (JSON fields)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in logfields.current().items():
            setattr(record, key, value)
        return True


def log_format(asked: str | None = None) -> str:
    """`json` or `text`: as asked (or $GPUOPS_LOG_FORMAT), else text on a terminal and JSON
    lines anywhere else (a container's log collector)."""
    chosen = (asked or os.environ.get("GPUOPS_LOG_FORMAT") or "auto").strip().lower()
    if chosen == "auto":
        return "text" if sys.stderr.isatty() else "json"
    if chosen not in ("json", "text"):
        raise ValueError(f"GPUOPS_LOG_FORMAT is {chosen!r}: it is json, text or auto")
    return chosen


def configure_logging(*, verbose: bool, secrets: Iterable[str] = (), fmt: str | None = None) -> None:
    """Log to stderr, INFO with -v else WARNING, as text or JSON lines (`log_format`),
    every handler redacting `secrets`."""
    handler = logging.StreamHandler()
    if log_format(fmt) == "json":
        handler.setFormatter(_JsonLines(list(JSON_FIELDS), rename_fields=JSON_NAMES))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_LogFields())
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    protect(secrets)


def protect(secrets: Iterable[str]) -> None:
    """Add the secrets to the redaction filter of every root handler."""
    secrets = tuple(secrets)
    for handler in logging.getLogger().handlers:
        for existing in [f for f in handler.filters if isinstance(f, RedactSecrets)]:
            handler.removeFilter(existing)
            secrets += existing._given
        handler.addFilter(RedactSecrets(secrets))
