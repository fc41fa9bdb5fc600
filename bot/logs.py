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
import re
import urllib.parse
from collections.abc import Iterable

REDACTED = "[redacted]"
_TOKEN_SHAPED = re.compile(r"\bx(?:ox[abposre]|app)-[A-Za-z0-9-]+")
# Slack payloads still carry the legacy verification token as a `token` field, and bolt
# logs a request's body in some of its lines. The field may be JSON (`"token": "x"`), a
# form (`token=x`) or JSON URL-encoded in a form (`%22token%22%3A%22x%22`).
_QUOTE = r"""(?:["']|%22|%27)"""
_FIELD_VALUE = r"""(?:(?!%22|%27|%26|%2C|%7D)[^&"'\s,}])+"""
_SECRET_FIELD = re.compile(
    rf"""((?:\b|(?<=%22)|(?<=%27))(?:token|response_url){_QUOTE}?\s*(?:[:=]|%3A|%3D)\s*{_QUOTE}?)"""
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


def configure_logging(*, verbose: bool, secrets: Iterable[str] = ()) -> None:
    """Log to stderr, INFO with -v else WARNING, every handler redacting `secrets`."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    protect(secrets)


def protect(secrets: Iterable[str]) -> None:
    """Add the secrets to the redaction filter of every root handler."""
    secrets = tuple(secrets)
    for handler in logging.getLogger().handlers:
        for existing in [f for f in handler.filters if isinstance(f, RedactSecrets)]:
            handler.removeFilter(existing)
            secrets += existing._given
        handler.addFilter(RedactSecrets(secrets))
