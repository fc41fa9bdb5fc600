"""The Kubernetes gateway: the only code (with the watch cache that reads through it)
that talks to the API server. `KubeGateway` is the one door; each module here does one
part of its work:

- `client`: the connection (a kubeconfig or the in-cluster ServiceAccount) and the one
  request function, which owns retries, backoff, Retry-After and each call's deadline,
  turns HTTP errors into the typed tree of `workflows.kube.errors`, and tells the
  process's observer of every call. The only module that imports the kubernetes client.
- `reading`: lists page by page, and what the engine and the plans read fresh.
- `watching`: watches, with the deadlines that tell a dead connection from a quiet one.
- `writing`: every write (node patches, custom-object patches, evictions, pods, the
  Lease), each dry-runnable and logged as a mutation.
- `decoding`: answers into the schemas of `workflows.kube.wire` (no per-object model
  classes: a 5,000-node list stays fast) and JSON into the frozen views of
  `workflows.kube.objects`.
- `paths`: where the collections gpuops uses live in the API.
"""

from __future__ import annotations

from workflows.kube.gateway.reading import KubeReads
from workflows.kube.gateway.watching import KubeWatches
from workflows.kube.gateway.writing import KubeWrites


class KubeGateway(KubeReads, KubeWatches, KubeWrites):
    """One authenticated connection to an API server: its reads, watches and writes.

    Reads are retried on connection errors, 429 (honouring Retry-After) and 5xx; writes
    are retried only on 429, which the server sends before doing anything.
    """
