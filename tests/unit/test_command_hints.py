"""Every `/gpu ...` command that gpuops suggests to a user (in findings, checklists,
help and messages) is one the dispatcher knows."""

from __future__ import annotations

import re
from pathlib import Path

from commands.catalog import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
HINT = re.compile(r"""["'`]/gpu ([a-z][a-z-]*(?: [a-z][a-z-]*)?)""")


def test_every_suggested_gpu_command_exists():
    unknown = {}
    for package in ("bot", "commands", "workflows"):
        for path in (ROOT / package).rglob("*"):
            if path.suffix not in (".py", ".j2"):
                continue
            for words in HINT.findall(path.read_text()):
                spec, _ = REGISTRY.resolve(words.split())
                if spec is None:
                    unknown.setdefault(f"/gpu {words}", []).append(str(path.relative_to(ROOT)))
    assert not unknown, unknown
