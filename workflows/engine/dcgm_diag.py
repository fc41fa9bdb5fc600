"""DCGM's diagnostics as a check (`gpu_check: {diag: 1|2|3}`): the command the check pod
runs, and what its `dcgmi diag -j` output says, test by test and GPU by GPU. No I/O here.

The command starts a host engine inside the pod (`nv-hostengine -n`, in the foreground, so
it is sent to the background by the shell), waits until it answers, then runs `dcgmi diag
-r <level> -j` on every GPU the pod holds. The JSON goes to the pod's log (the step reads it
there, capped) and is also copied to the termination message, which the kubelet keeps (its
first 4 KiB) where logs cannot be read.

The JSON is pinned to the DCGM of `workflows.pools.config.DIAG_IMAGE` (DCGM 4): its top
level is `"DCGM Diagnostic"`, each result names its entity (`entity_group`, `entity_id`)
and each test carries a `test_summary`. DCGM 3's shape (`"DCGM GPU Diagnostic"`, results
by `gpu_ids`, a string "0,1,2" for a test over several GPUs) is read too; anything else is
refused with what was found. A document that does not parse (cut short, not JSON, no test
in it) is an unreadable result, never a pass."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# The top-level key of each DCGM major version's `dcgmi diag -j` document.
DCGM4_KEY = "DCGM Diagnostic"
DCGM3_KEY = "DCGM GPU Diagnostic"
# How much of the pod's log is read: an 8-GPU level 3 document is tens of KiB.
LOG_LIMIT_BYTES = 512 * 1024
# How many failed results a thread quotes before it says how many more there are.
QUOTED = 6
_FAILING = frozenset({"fail", "failed", "error"})

DiagShape = Literal["dcgm4", "dcgm3"]


def command(level: int) -> tuple[str, ...]:
    """The check pod's command for diagnostics at `level`: a host engine in the pod, then
    `dcgmi diag -r <level> -j`; its exit code is dcgmi's."""
    script = (
        "nv-hostengine -n >/tmp/hostengine.log 2>&1 & "
        "for _ in $(seq 60); do dcgmi discovery -l >/dev/null 2>&1 && break; sleep 1; done; "
        f"dcgmi diag -r {int(level)} -j >/tmp/diag.json; rc=$?; "
        "cat /tmp/diag.json; head -c 4096 /tmp/diag.json >/dev/termination-log; "
        "exit $rc"
    )
    return ("/bin/sh", "-c", script)


@dataclass(frozen=True, slots=True)
class DiagResult:
    """One test's answer for one entity (a GPU, or "all" for a test DCGM runs once)."""

    category: str
    test: str
    gpu: str
    status: str
    warnings: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status.strip().lower() in _FAILING


@dataclass(frozen=True, slots=True)
class DiagReport:
    """A parsed `dcgmi diag -j` document: which shape it had, the DCGM version it names,
    every result, and a runtime error DCGM reported instead of running."""

    shape: DiagShape
    version: str | None
    results: tuple[DiagResult, ...]
    runtime_error: str | None = None

    @property
    def failures(self) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.failed)

    @property
    def passed(self) -> bool:
        return self.runtime_error is None and bool(self.results) and not self.failures

    @property
    def gpus(self) -> frozenset[str]:
        """The GPUs the results name, once each: a DCGM 3 test run once over several GPUs
        names them together ("0,1,2"), and a test DCGM runs once names none ("all")."""
        return frozenset(g.strip() for r in self.results if r.gpu != "all" for g in r.gpu.split(","))

    def failed_tests(self) -> tuple[str, ...]:
        """The failing tests, once each, in the document's order."""
        return tuple(dict.fromkeys(r.test for r in self.failures))


class DiagUnreadable(ValueError):
    """The output is no `dcgmi diag -j` document this parser reads; the message says why."""


def parse(text: str | bytes | None) -> DiagReport:
    """The report `text` (the pod's output) holds. Anything before the first `{` (a
    warning dcgmi printed) is skipped. DiagUnreadable for anything else, never another error."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not text or "{" not in text:
        raise DiagUnreadable("no JSON in the output")
    body = text[text.index("{"):]
    try:
        document, _ = json.JSONDecoder().raw_decode(body)
    except RecursionError:
        raise DiagUnreadable("not JSON (nested too deep)") from None
    except ValueError as err:
        cut = _unclosed(body) and (not isinstance(err, json.JSONDecodeError) or err.pos >= len(body.rstrip())
                                   or err.msg.startswith("Unterminated string"))
        raise DiagUnreadable("the JSON is cut short" if cut else f"not JSON ({err})") from None
    if not isinstance(document, Mapping):
        raise DiagUnreadable("the JSON is not an object")
    if DCGM4_KEY in document:
        return _read(document[DCGM4_KEY], "dcgm4", _version(document.get("metadata")) or
                     _version(document[DCGM4_KEY]))
    if DCGM3_KEY in document:
        return _read(document[DCGM3_KEY], "dcgm3", _version(document[DCGM3_KEY]))
    keys = ", ".join(sorted(str(k) for k in document)[:5]) or "none"
    raise DiagUnreadable(f"neither {DCGM4_KEY!r} (DCGM 4) nor {DCGM3_KEY!r} (DCGM 3) at the top (found: {keys})")


def _unclosed(body: str) -> bool:
    """Whether `body` ends inside an object, an array or a string (output cut short)."""
    open_: list[str] = []
    in_string, escaped = False, False
    for char in body:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            open_.append("}" if char == "{" else "]")
        elif char in "}]":
            if not open_ or open_.pop() != char:
                return False  # a bracket closed that was not open: broken, not cut
    return in_string or bool(open_)


def _version(part: Any) -> str | None:
    if isinstance(part, Mapping) and isinstance(part.get("version"), str):
        return str(part["version"])
    return None


def _read(root: Any, shape: DiagShape, version: str | None) -> DiagReport:
    if not isinstance(root, Mapping):
        raise DiagUnreadable(f"{shape}: the diagnostic is not an object")
    error = root.get("runtime_error")
    categories = root.get("test_categories")
    if categories is None and isinstance(error, str) and error:
        return DiagReport(shape=shape, version=version, results=(), runtime_error=error)
    if not isinstance(categories, Sequence) or isinstance(categories, str):
        raise DiagUnreadable(f"{shape}: no test_categories list")
    results: list[DiagResult] = []
    for category in categories:
        if not isinstance(category, Mapping):
            continue  # DCGM 3 writes `null` between tests
        name = str(category.get("category") or "?")
        for test in category.get("tests") or ():
            if isinstance(test, Mapping):
                results += _results(name, test)
    if not results and not error:
        raise DiagUnreadable(f"{shape}: no test result in the output")
    return DiagReport(shape=shape, version=version, results=tuple(results),
                      runtime_error=error if isinstance(error, str) and error else None)


def _results(category: str, test: Mapping[str, Any]) -> list[DiagResult]:
    name = str(test.get("name") or "?")
    found: list[DiagResult] = []
    for entry in test.get("results") or ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("status"), str):
            continue
        found.append(DiagResult(category=category, test=name, gpu=_entity(entry), status=entry["status"],
                                warnings=_warnings(entry.get("warnings"))))
    summary = test.get("test_summary")
    if not found and isinstance(summary, Mapping) and isinstance(summary.get("status"), str):
        # A test with no per-entity result still says whether it failed.
        found.append(DiagResult(category=category, test=name, gpu="all", status=summary["status"]))
    return found


def _entity(entry: Mapping[str, Any]) -> str:
    if "entity_id" in entry:  # DCGM 4
        group = entry.get("entity_group")
        return str(entry["entity_id"]) if group in (None, "GPU") else f"{group} {entry['entity_id']}"
    ids = entry.get("gpu_ids")  # DCGM 3: an id, or "0,1,2" for a test run once over several
    return str(ids) if ids is not None else "all"


def _warnings(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return ()
    found = [w.get("warning") if isinstance(w, Mapping) else w for w in raw]
    return tuple(str(w).strip() for w in found if isinstance(w, str) and w.strip())
