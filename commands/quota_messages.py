"""The sentences of /gpu quotas (commands/quotas.py)."""

from __future__ import annotations

QUOTA_COLUMNS = ("namespace", "quota", "used", "can land on", "capacity", "flags")
QUOTA_POD_COLUMNS = ("pod", "phase", "node", "asks", "constraints", "can land on")
QUOTA_ENTRY_COLUMNS = ("quota", "entry", "hard", "used (quota status)", "scopes")
QUOTA_FLAG_WORDS = {"exceeds": "exceeds pools", "overcommit": "overcommitted",
                    "unquoted-serving": "no quota, serving pool", "not-enforced": "entry not enforced"}


def quotas_title(scope: str | None = None, *, kind: str | None = None) -> str:
    return f"GPU quotas · {kind} {scope}" if scope and kind else "GPU quotas"


def quotas_summary(*, namespaces: int, quotas: int, flags: int) -> str:
    flagged = f"{flags} flag{'s' if flags != 1 else ''}" if flags else "nothing flagged"
    return (f"{namespaces} namespace{'s' if namespaces != 1 else ''} with a GPU quota or GPU pods · "
            f"{quotas} ResourceQuota{'s' if quotas != 1 else ''} on GPUs · {flagged}")


def no_quotas_or_gpu_pods() -> str:
    return "No namespace has a GPU quota or GPU pods."


def quotas_unavailable() -> str:
    return "GPU quotas are not available here: this gpuops has no Kubernetes API to read them from."


def quotas_unreadable_title() -> str:
    return "Cannot read GPU quotas"


def pool_landing_summary(namespaces: int) -> str:
    if not namespaces:
        return "No namespace's GPU pods or quota can land on this pool."
    return f"{namespaces} namespace{'s' if namespaces != 1 else ''} can land on this pool"


def no_gpu_quota() -> str:
    return "none"
