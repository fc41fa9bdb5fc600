"""Identifiers of stored things.

Requests and runs have short prefixed text ids because people read and type them in
Slack (`/gpu approve req-7f3a2c`). Everything else is an integer rowid.
"""

from __future__ import annotations

import secrets
from typing import NewType

RequestId = NewType("RequestId", str)
RunId = NewType("RunId", str)
ApprovalId = NewType("ApprovalId", int)
StepId = NewType("StepId", int)
OutboxId = NewType("OutboxId", int)
HandoverId = NewType("HandoverId", int)
HandoverAckId = NewType("HandoverAckId", int)
AuditSeq = NewType("AuditSeq", int)

# 6 hex digits keep ids easy to type; collisions are retried at insert (the repositories
# check for a free id under the write lock), so the short space costs nothing.
_ID_HEX_BYTES = 3


def new_request_id() -> RequestId:
    return RequestId(f"req-{secrets.token_hex(_ID_HEX_BYTES)}")


def new_run_id() -> RunId:
    return RunId(f"run-{secrets.token_hex(_ID_HEX_BYTES)}")
