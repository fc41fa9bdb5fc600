"""A STAND-IN for a GitOps controller (it is not Argo CD or Flux): it keeps one
ClusterPolicy's or NVIDIADriver's driver version as "Git" says, the way Argo CD's
self-heal or Flux's reconcile does, so tests can show what gpuops does where Git owns the
driver object.

Like Argo CD with server-side apply, it applies the object's version field with its own
field manager (`argocd-controller`) and marks (the tracking annotation and the
`app.kubernetes.io/instance` label), force-taking the field, and applies again every
`resync` seconds: a version someone else patched in is put back within that. `commit`
is a change merged in Git; the next sync applies it."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kubernetes.client.rest import ApiException

from testenv.install import Installer

log = logging.getLogger("gpuops.testenv.gitops_standin")

# The field manager and marks Argo CD leaves (server-side apply).
STANDIN_MANAGER = "argocd-controller"
TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
INSTANCE_LABEL = "app.kubernetes.io/instance"

_WHERE = {
    "ClusterPolicy": ("/apis/nvidia.com/v1/clusterpolicies", "nvidia.com/v1", ("driver", "version")),
    "NVIDIADriver": ("/apis/nvidia.com/v1alpha1/nvidiadrivers", "nvidia.com/v1alpha1", ("version",)),
}


class StandInGitOpsController:
    """Keeps `kind` `name`'s driver version at what "Git" names (`commit` changes it),
    as application `application`; start with `with` (a thread syncs until the block ends)."""

    def __init__(self, installer: Installer, *, kind: str, name: str, version: str,
                 application: str = "gpu-operator", resync: float = 1.0) -> None:
        if kind not in _WHERE:
            raise ValueError(f"the stand-in keeps a ClusterPolicy or an NVIDIADriver, not a {kind}")
        self.installer, self.kind, self.name, self.application = installer, kind, name, application
        self.resync = resync
        self._git = version
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Condition()
        self._syncs = 0
        self._thread = threading.Thread(target=self._loop, name=f"standin-gitops-{name}", daemon=True)

    # -- what "Git" says

    @property
    def git_version(self) -> str:
        with self._lock:
            return self._git

    def commit(self, version: str) -> None:
        """A change of the version merged in Git: applied at the next sync."""
        with self._lock:
            self._git = version

    # -- syncing

    def sync(self) -> None:
        """Apply what Git names now, force-taking the version field (self-heal)."""
        path, api_version, field = _WHERE[self.kind]
        spec: dict[str, Any] = {field[-1]: self.git_version}
        for key in reversed(field[:-1]):
            spec = {key: spec}
        body = {"apiVersion": api_version, "kind": self.kind, "metadata": {
            "name": self.name, "labels": {INSTANCE_LABEL: self.application},
            "annotations": {TRACKING_ANNOTATION: f"{self.application}:nvidia.com/{self.kind}:/{self.name}"}},
            "spec": spec}
        self.installer.call("PATCH", f"{path}/{self.name}", body=json.dumps(body),
                            content_type="application/apply-patch+yaml",
                            query=[("fieldManager", STANDIN_MANAGER), ("force", "true")])
        with self._synced:
            self._syncs += 1
            self._synced.notify_all()

    def wait_synced(self, *, syncs: int = 1, timeout: float = 30.0) -> None:
        """Wait until `syncs` more syncs have been applied."""
        with self._synced:
            target = self._syncs + syncs
            if not self._synced.wait_for(lambda: self._syncs >= target, timeout=timeout):
                raise TimeoutError(f"the stand-in GitOps controller did not sync {self.kind} {self.name}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except ApiException as err:  # an API hiccup: the next resync tries again
                log.warning("stand-in GitOps sync of %s %s failed: %s", self.kind, self.name, err.reason)
            self._stop.wait(self.resync)

    def __enter__(self) -> StandInGitOpsController:
        self.sync()  # the object is the application's before the test goes on
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
