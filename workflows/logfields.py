"""The ids a log line is about (request, run, step, node), carried by context rather than
by every call: the engine binds them while it works on a run or a step, and the JSON log
formatter (`bot.logs`) writes them as fields, so a log search by run id finds every line
of that run whatever its text says."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

_EMPTY: Mapping[str, str] = MappingProxyType({})
_fields: ContextVar[Mapping[str, str]] = ContextVar("gpuops_log_fields", default=_EMPTY)


@contextmanager
def bound(**ids: object) -> Iterator[None]:
    """Lines logged inside carry these ids (None values are left out) beside the outer ones."""
    token = _fields.set(MappingProxyType({**_fields.get(), **{k: str(v) for k, v in ids.items() if v is not None}}))
    try:
        yield
    finally:
        _fields.reset(token)


def current() -> Mapping[str, str]:
    return _fields.get()
