"""Logging for the gpuops process, with secrets redacted.

slack_sdk already hides the Authorization header in its debug logs, but a token can
still reach a log line another way (an exception's repr, a URL, a misconfigured env
dump). So every handler gets a filter that replaces the configured secrets, and
anything shaped like a Slack token, with `[redacted]` before the record is written.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "[redacted]"
_TOKEN_SHAPED = re.compile(r"\bx(?:ox[abposre]|app)-[A-Za-z0-9-]+")
# Slack payloads still carry the legacy verification token as a `token` field, and bolt
# logs a rejected request's body.
_TOKEN_FIELD = re.compile(r"""(\btoken["']?\s*[:=]\s*["']?)[^&"'\s,}]+""")


class RedactSecrets(logging.Filter):
    """Rewrites a record's message (arguments merged in) with secrets masked."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        text = _TOKEN_SHAPED.sub(REDACTED, text)
        return _TOKEN_FIELD.sub(lambda m: m.group(1) + REDACTED, text)

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
            secrets += tuple(existing._secrets)
        handler.addFilter(RedactSecrets(secrets))
