"""Slack credentials, read once at start from the environment or from files.

Each secret comes from `NAME` or from the file named by `NAME_FILE` (a mounted
Kubernetes Secret), never from the command line or the configuration file, so it does
not end up in shell history, `ps` output or a ConfigMap. A missing or malformed one stops
`gpuops run` with a sentence saying which and how to fix it (`CredentialsError`). The
values are kept out of `repr()` and are registered with the log redactor.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bot import messages as msg

Mode = Literal["socket", "http"]

BOT_TOKEN = "SLACK_BOT_TOKEN"
APP_TOKEN = "SLACK_APP_TOKEN"
SIGNING_SECRET = "SLACK_SIGNING_SECRET"

# What each token must look like: bot tokens start xoxb-, app-level tokens xapp-.
_PREFIXES = {BOT_TOKEN: "xoxb-", APP_TOKEN: "xapp-"}


class CredentialsError(Exception):
    """A credential is missing or unusable; the message says which and what to do."""


@dataclass(frozen=True)
class SlackCredentials:
    mode: Mode
    bot_token: str = field(repr=False)
    app_token: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.bot_token, self.app_token, self.signing_secret) if s)


def _read(name: str, env: Mapping[str, str]) -> str | None:
    direct = env.get(name, "").strip()
    file_name = env.get(f"{name}_FILE", "").strip()
    if direct and file_name:
        raise CredentialsError(msg.credential_twice(name))
    if file_name:
        try:
            value = Path(file_name).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise CredentialsError(msg.credential_file_unreadable(name, file_name, err.strerror or str(err))) from None
        if not value:
            raise CredentialsError(msg.credential_file_empty(name, file_name))
        return value
    return direct or None


def _token(name: str, env: Mapping[str, str], *, why: str) -> str:
    value = _read(name, env)
    if value is None:
        raise CredentialsError(msg.credential_missing(name, why))
    prefix = _PREFIXES[name]
    if not value.startswith(prefix) or len(value) <= len(prefix) or any(c.isspace() for c in value):
        # Name the kind of token it is (xoxp-, xapp-, ...), never any of its secret part.
        kind = re.match(r"^x[a-z]{2,3}-", value)
        raise CredentialsError(msg.credential_malformed(name, prefix, kind.group(0) if kind else None))
    return value


def load_credentials(mode: Mode, env: Mapping[str, str] | None = None) -> SlackCredentials:
    """The credentials `mode` needs: Socket Mode the bot and app-level tokens, HTTP mode
    the bot token and the signing secret."""
    env = os.environ if env is None else env
    bot_token = _token(BOT_TOKEN, env, why=msg.why_bot_token())
    if mode == "socket":
        app_token = _token(APP_TOKEN, env, why=msg.why_app_token())
        return SlackCredentials(mode=mode, bot_token=bot_token, app_token=app_token)
    secret = _read(SIGNING_SECRET, env)
    if secret is None:
        raise CredentialsError(msg.credential_missing(SIGNING_SECRET, msg.why_signing_secret()))
    if len(secret) < 16 or any(c.isspace() for c in secret):
        raise CredentialsError(msg.signing_secret_malformed())
    return SlackCredentials(mode=mode, bot_token=bot_token, signing_secret=secret)
