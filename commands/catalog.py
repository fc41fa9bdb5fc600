"""Every command module, imported once so each registers itself; entry points import
`dispatch` (a typed line), `dispatch_words` (words split already: argv) and
`run_command` (a command with its values read) from here. The commands of each kind of
change come with the kind's registry line (workflows/kinds.py `commands`), imported by the
registry for the kinds in force (`kind_commands_loaded`)."""

import importlib

from commands.registry import (REGISTRY, Call, access_refusal, dispatch, dispatch_words, help_reply,
                               kind_commands_loaded, run_command)

for _module in ("commands.fleet", "commands.requests", "commands.handover", "commands.quotas", "commands.freezes",
                "commands.drift"):
    importlib.import_module(_module)
kind_commands_loaded()

__all__ = ["REGISTRY", "Call", "access_refusal", "dispatch", "dispatch_words", "help_reply", "run_command"]
