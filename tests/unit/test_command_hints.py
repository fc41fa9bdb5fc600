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


def test_help_examples_name_this_fleets_pools_and_nodes_not_the_samples_they_are_written_with(make, tmp_path):
    from commands.catalog import dispatch
    from commands.services import Services
    from storage.database import open_database
    from workflows.config import GpuopsConfig

    config = GpuopsConfig.model_validate({"pools": {"inference-b": {"kind": "serving", "windows": "always"}},
                                          "access": {"users": {"U0ALICE": ["operator"]}}})
    nodes = [make.node(f"inf-b-{n:02d}", pool="inference-b") for n in (1, 2)]

    class Fleet:
        def fleet(self, now):
            return make.fleet(nodes)

    db = open_database(tmp_path / "gpuops.db")
    services = Services.on_database(config=config, fleet=Fleet(), database=db)
    actor = config.actor("U0ALICE")

    drain = dispatch("help drain", actor=actor, services=services, now=make.now)
    examples = [b for s in drain.sections for b in (s.bullets or ())]
    assert any("/gpu drain inf-b-01 inf-b-02 at sat 02:00" in e for e in examples), examples
    status = dispatch("help status", actor=actor, services=services, now=make.now)
    assert any("/gpu status inference-b" in b for s in status.sections for b in (s.bullets or ()))
    # A usage answer shows them too.
    wrong = dispatch("node", actor=actor, services=services, now=make.now)
    assert "gpu-a-01" not in (wrong.footer or "") and "serving-a-05" not in (wrong.footer or "")
    assert "/gpu node inf-b-01" in (wrong.footer or ""), wrong.footer
    db.close()
