"""Where the gpuops database is: a SQLite file's path or a PostgreSQL URL, parsed once.

`database_location(text)` tells the two apart and refuses a shape that is neither with a
sentence naming what is wrong (`BadDatabaseLocation`): another database's scheme, a
SQLAlchemy-style `postgresql+psycopg://`, a port that is not a number, a URL naming no
database. What `open_database` takes is `DatabaseLocation.target`; what any message,
log line or error shows is `DatabaseLocation.shown`, the URL with its password (in the
user part or as `?password=`) replaced by `***`. Where the password may come from (never
the configuration file or the command line in clear) is the caller's rule: this module
only says whether a URL carries one (`DatabaseLocation.secrets`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

from storage.errors import StorageError

_POSTGRES_SCHEMES = ("postgresql", "postgres")
_REDACTED = "***"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

_Dialect = Literal["sqlite", "postgresql"]


class BadDatabaseLocation(StorageError):
    """`database`, `--database` or a database URL from a secret is neither a SQLite path nor
    a PostgreSQL URL gpuops can use; the message says what is wrong, never the password."""


@dataclass(frozen=True)
class DatabaseLocation:
    """A parsed database location. `target` holds the password (for the driver only)."""

    target: str | Path = field(repr=False)
    dialect: _Dialect
    shown: str
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def has_password(self) -> bool:
        return bool(self.secrets)

    def __str__(self) -> str:
        return self.shown


def database_location(text: str | Path) -> DatabaseLocation:
    """The location `text` names: a `postgresql://` / `postgres://` URL, else a SQLite path."""
    if isinstance(text, Path):
        return DatabaseLocation(target=text, dialect="sqlite", shown=str(text))
    text = text.strip()
    if not text:
        raise BadDatabaseLocation("the database location is empty: give a SQLite file's path or a "
                                  "postgresql://HOST/DATABASE URL")
    scheme = _SCHEME.match(text)
    if scheme is None:
        return DatabaseLocation(target=Path(text), dialect="sqlite", shown=text)
    name = scheme.group(1).lower()
    if name.startswith(tuple(f"{s}+" for s in _POSTGRES_SCHEMES)):
        raise BadDatabaseLocation(f"{name}:// is SQLAlchemy's form; gpuops takes the plain postgresql:// URL "
                                  "(drop the '+driver' part)")
    if name == "sqlite":
        raise BadDatabaseLocation("a SQLite database is given as the file's path itself, not as a sqlite:// URL")
    if name not in _POSTGRES_SCHEMES:
        raise BadDatabaseLocation(f"{name}:// is not a database gpuops uses: give a SQLite file's path or a "
                                  "postgresql://HOST/DATABASE URL")
    return _postgres_location(text)


def _postgres_location(text: str) -> DatabaseLocation:
    parts = urlsplit(text)
    secrets: list[str] = []
    if parts.password:
        secrets += [parts.password, unquote(parts.password)]
    query = parse_qsl(parts.query, keep_blank_values=True)
    secrets += [value for key, value in query if key.lower() == "password" and value]
    shown = _redacted(parts, query, has_user_password=bool(parts.password))
    try:
        port = parts.port
    except ValueError:
        raise BadDatabaseLocation(f"{shown}: the port is not a number from 1 to 65535") from None
    if port == 0:
        raise BadDatabaseLocation(f"{shown}: the port is not a number from 1 to 65535")
    if parts.fragment:
        raise BadDatabaseLocation(f"{shown}: a database URL has no '#' part")
    database = parts.path.lstrip("/")
    if not database:
        raise BadDatabaseLocation(f"{shown}: name the database (postgresql://HOST/DATABASE)")
    if "/" in database:
        raise BadDatabaseLocation(f"{shown}: the path is one database name, not {database!r}")
    if any(c.isspace() for c in (parts.hostname or "")):
        raise BadDatabaseLocation(f"{shown}: the host name has a space in it")
    return DatabaseLocation(target=text, dialect="postgresql", shown=shown,
                            secrets=tuple(dict.fromkeys(s for s in secrets if s)))


def redacted_url(url: str) -> str:
    """`url` with any password (in the user part or as `?password=`) replaced by `***`."""
    parts = urlsplit(url)
    return _redacted(parts, parse_qsl(parts.query, keep_blank_values=True), has_user_password=bool(parts.password))


def _redacted(parts: SplitResult, query: list[tuple[str, str]], *, has_user_password: bool) -> str:
    scheme, netloc, path, _query, fragment = parts
    if has_user_password:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{_REDACTED}@{hostport}"
    shown_query = urlencode([(k, _REDACTED if k.lower() == "password" else v) for k, v in query], safe="*")
    # Written out: urlunsplit drops the empty host of postgresql:///db (a local socket).
    return (f"{scheme}://{netloc}{path}" + (f"?{shown_query}" if shown_query else "")
            + (f"#{fragment}" if fragment else ""))
