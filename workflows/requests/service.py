"""Requests and their approvals: submit, approve, deny, cancel, re-plan (also of a
drain's window end, `extend_window`), expire, and mark a missed window (`mark_missed`).
`RequestService` is one object for its callers, assembled from a module per task:
`submitting` (submit, cancel, re-plan, extend before the run, mark missed), `approving`
(approvals and the two-person rule, deny, reopen, expiry), `drain_extensions` (a running
drain's later window end), `rollbacks` (rollbacks and continuations of runs), on
`records` (reading, and the records every change writes); what it returns is in `views`,
what it raises in `errors`.

A running drain's later window end (`extend_running`) waits as a pending extension on
its own plan hash, approved by the same rules (`policy.as_extension`), applied to the
run's holds when the count is reached (`workflows.requests.extension`), and lapses at
its deadline (`expire_due`, or an approval that comes too late).

`RequestService` applies `workflows.requests.policy` to what storage holds and records each
outcome. Every state change writes, in ONE transaction:

- the request's transition, as a storage compare-and-set (`expected=` state, or the
  expected plan hash for a re-plan);
- the approver's decision row, if there is one;
- an audit row (actor = Slack user id, or `gpuops` for expiry; `k8s_identity` is None,
  because nothing here touches the cluster; target = the pool; before/after = states);
- an outbox message for the request's thread, if the request has a channel.

Why this is safe under concurrency: `Database.transaction()` begins with `BEGIN
IMMEDIATE`, so the request and its approvals are read under the write lock and the
policy decides on rows no one else can change before commit; two approvals arriving at
once are counted one after the other, never both against the same count, and an
approval racing a deny finds the request already decided. The compare-and-set on the
transition is a second, independent guard: if it ever loses, the whole transaction is
rolled back and the caller is told the request changed meanwhile.

A change freeze on the pool (or the cluster) refuses `submit`, read under the same write
lock (workflows.pools.freezes); requests filed before it are left as they are.

Expiry is applied by `expire_due(now)` (the scheduler's sweep) and lazily whenever an
action touches a pending request whose deadline has passed: the expiry is committed,
then the action is refused saying when it expired.

Outbox payloads are JSON objects with `event` (the audit action), `request_id`, `pool`,
`kind`, `state` and `text` (a sentence from `workflows.requests.messages`). They are
posted to the request's channel and thread; messages queued before the thread exists
carry `thread_ts` None and the notifier may look the thread up by `request_id`.

Refusals raise `RequestRefused` (workflows.requests.errors) whose message is shown to the user verbatim; refusals
about roles raise `RequestAccessDenied`, which is also an `access.AccessDenied`. An id
that names no request raises `UnknownRequest` with the closest ids. Programming errors
(a plan for another pool, a naive datetime) raise `ValueError`.
"""

from __future__ import annotations

from workflows.requests.approving import Approving
from workflows.requests.rollbacks import RollbackLookups
from workflows.requests.submitting import Submitting


class RequestService(Submitting, Approving, RollbackLookups):
    """Requests on one database connection (one per thread, see `storage.database`).
    `on_approved` is called after any change that leaves a request approved."""


__all__ = ["RequestService"]
