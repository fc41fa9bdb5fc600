"""An in-memory record of what the bot did, in order: for the log and for tests, which
wait on it instead of sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Journal(Generic[T]):
    """Keeps the newest `keep` entries."""

    def __init__(self, keep: int = 1000) -> None:
        self._cond = threading.Condition()
        self._seen: list[T] = []
        self._keep = keep

    def record(self, entry: T) -> None:
        with self._cond:
            self._seen.append(entry)
            del self._seen[:-self._keep]
            self._cond.notify_all()

    def all(self) -> list[T]:
        with self._cond:
            return list(self._seen)

    def wait_for(self, predicate: Callable[[list[T]], bool], timeout: float = 30.0) -> list[T]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self._seen), timeout=timeout):
                raise TimeoutError(f"recorded so far: {self._seen}")
            return list(self._seen)
