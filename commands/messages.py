"""Every sentence the /gpu commands say, in one place."""

from __future__ import annotations

from workflows.access import Actor, Role, effective_roles

HELP_COLUMNS = ("command", "what it does", "role")


def usage_title(usage: str) -> str:
    return f"Usage: /gpu {usage}"


def examples_line(examples: tuple[str, ...]) -> str:
    return "Examples: " + " · ".join(f"`{e}`" for e in examples)


def example(text: str) -> str:
    return f"`{text}`"


def cannot_read_command() -> str:
    return "Could not read that command"


def unbalanced_quotes(detail: str) -> str:
    return f"The quotes do not pair up ({detail}). Quote a reason like \"driver reset\"."


def unknown_command(words: str) -> str:
    return f"Unknown command: {words}"


def did_you_mean(names: list[str]) -> str:
    if not names:
        return "No command is close to that."
    return "Did you mean " + " or ".join(f"`/gpu {n}`" for n in names) + "?"


def see_help() -> str:
    return "`/gpu help` lists every command."


def not_allowed_title() -> str:
    return "Not allowed"


def not_found_title() -> str:
    return "Not found"


def held_roles(actor: Actor) -> str:
    return ", ".join(sorted(effective_roles(actor.roles))) or "no role"


def needs_role(command: str, role: Role, actor: Actor) -> str:
    return f"`/gpu {command}` needs the {role} role; {actor.name} has {held_roles(actor)}."


def no_role(actor: Actor) -> str:
    return f"{actor.name} has no gpuops role. Ask a gpuops admin to add you to the configuration."


def role_needed(role: Role, held: bool) -> str:
    return f"Needs the {role} role" + (" (you have it)." if held else " (you do not have it).")


def help_title() -> str:
    return "gpuops: GPU fleet operations"


def help_summary() -> str:
    return "Commands you can run. `/gpu help <command>` shows examples."


# --- fleet -----------------------------------------------------------------------------

def unknown_name(kind: str, name: str, closest: list[str], known: int) -> str:
    if closest:
        return f"No {kind} named `{name}`. Closest: " + ", ".join(f"`{c}`" for c in closest) + "."
    return f"No {kind} named `{name}` ({known} {kind}s known)."


def no_operator() -> str:
    return "No GPU Operator found in this cluster (no ClusterPolicy CRD or operator Deployment)."


def status_title(pool: str | None = None) -> str:
    return f"GPU pool {pool}" if pool else "GPU fleet status"


def fleet_summary(nodes: int, ready: int, advertised: int, expected: int, critical: int, warning: int) -> str:
    problems = []
    if critical:
        problems.append(f"{critical} critical")
    if warning:
        problems.append(f"{warning} warning{'s' if warning != 1 else ''}")
    health = ", ".join(problems) if problems else "no problems found"
    return f"{ready}/{nodes} GPU nodes Ready · {advertised}/{expected} GPUs advertised · {health}"


def no_gpu_nodes() -> str:
    return "No GPU nodes found (no node has nvidia.com/gpu.present=true, GFD labels or GPU capacity)."


def more_findings(count: int) -> str:
    return f"and {count} more: `/gpu findings`"


def findings_title(scope: str | None) -> str:
    return f"Findings for {scope}" if scope else "Findings"


def no_findings(scope: str | None) -> str:
    return f"No findings for {scope}." if scope else "No findings: the fleet looks healthy."


def node_title(name: str) -> str:
    return f"GPU node {name}"


def not_a_gpu_node(name: str) -> str:
    return f"`{name}` is a node, but not a GPU node (no GPU labels or capacity)."


POOL_COLUMNS = ("pool", "kind", "nodes ready", "GPUs adv/expected", "in use", "driver", "auto-upgrade", "problems")
NODE_COLUMNS = ("node", "ready", "cordon", "GPUs adv/expected", "in use", "driver", "owner", "state")
FINDING_COLUMNS = ("severity", "subject", "finding")
