"""Every command module, imported once so each registers itself; entry points import
`dispatch` (a typed line), `dispatch_words` (words split already: argv) and
`run_command` (a command with its values read) from here."""

import importlib

from commands.registry import REGISTRY, Call, access_refusal, dispatch, dispatch_words, help_reply, run_command

for _module in ("commands.fleet", "commands.requests", "commands.drain", "commands.upgrade", "commands.mig", "commands.migrate", "commands.handover",
                "commands.quotas", "commands.freezes", "commands.drift"):
    importlib.import_module(_module)

__all__ = ["REGISTRY", "Call", "access_refusal", "dispatch", "dispatch_words", "help_reply", "run_command"]
