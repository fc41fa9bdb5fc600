"""A real local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, bound to 127.0.0.1 on free ports, in one process group.

kube-apiserver runs with RBAC, a client-certificate admin identity and a static token
file holding the test identities (the bot's ServiceAccount and human users). Every
component logs to its own file in the control plane's folder; a component that does not
come up fails the start with a message naming that file.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testenv import operator
from testenv.pki import Pki, create_pki

# kwok manages only nodes that carry this annotation (the testenv's fleet sets it).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"

# Identity of the bot when it runs in a cluster: namespace gpuops, ServiceAccount gpuops.
BOT_USER = "system:serviceaccount:gpuops:gpuops"
BOT_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:gpuops")
TEST_USERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bot": (BOT_USER, BOT_GROUPS),
    "alice": ("alice", ("gpu-operators",)),
    "bob": ("bob", ("gpu-approvers",)),
}

# The audit policy: the bot's writes, with their bodies; nothing else (kwok's heartbeats
# and the controllers' writes would be most of the log).
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Request", "users": [BOT_USER], "verbs": ["create", "update", "patch", "delete",
                                                                  "deletecollection"]},
              {"level": "None"}],
}

CONTROLLERS = (
    "daemonset-controller",
    "replicaset-controller",
    "deployment-controller",
    "job-controller",
    "disruption-controller",
    "garbage-collector-controller",
    "namespace-controller",
)

_STAGES = Path(__file__).with_name("stages.yaml")


class ControlPlaneError(RuntimeError):
    """A component failed to start or stop; the message names its log file."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    # NB: children get SIGKILL if the process that started them dies, so a killed test
    # run leaves no control plane behind (PR_SET_PDEATHSIG = 1).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class ControlPlane:
    """Start with `start()`, stop with `stop()`; or use it as a context manager."""

    bin_dir: Path
    folder: Path
    die_with_parent: bool = True
    # More kube-apiserver flags, e.g. ["--watch-cache=false"] for a test that needs
    # watches served by etcd itself.
    apiserver_args: tuple[str, ...] = ()
    server: str = ""
    kubeconfig: Path = field(init=False)
    tokens: dict[str, str] = field(default_factory=dict)
    _components: list[_Component] = field(default_factory=list)
    _pgid: int | None = None
    _pki: Pki | None = None

    def __post_init__(self) -> None:
        self.kubeconfig = self.folder / "kubeconfig"

    # --- lifecycle -------------------------------------------------------------------
    def start(self, *, timeout: float = 120.0) -> ControlPlane:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Every start is a new cluster: an old etcd folder would bring back old objects.
        shutil.rmtree(self.folder / "etcd", ignore_errors=True)
        self._pki = create_pki(self.folder / "pki")
        self.tokens = {name: secrets.token_hex(16) for name in TEST_USERS}
        try:
            self._start_etcd(timeout=timeout)
            self._start_apiserver(timeout=timeout)
            self._write_kubeconfigs()
            self._start("kube-controller-manager", self._controller_manager_args())
            self._start("kube-scheduler", self._scheduler_args())
            self._start("kwok", self._kwok_args())
            self._wait_controllers_running()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, grace: float = 15.0) -> None:
        """Stop every component: SIGTERM to the group, then SIGKILL what is left."""
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for component in reversed(self._components):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                component.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                component.process.kill()
                component.process.wait(timeout=5)
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, signal.SIGKILL)
        self._components.clear()
        self._pgid = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self._components]

    def log_of(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every write the bot's identity sent (JSON lines,
        one per request at ResponseComplete, with the request body and the answer's code);
        the ground truth of what the bot did to the cluster, whatever the bot itself logged."""
        return self.folder / "logs" / "audit.jsonl"

    def kubeconfig_context(self, user: str) -> str:
        """The kubeconfig context of an identity: "admin" or a key of TEST_USERS."""
        if user != "admin" and user not in TEST_USERS:
            raise KeyError(f"no test identity {user!r}; known: admin, {', '.join(TEST_USERS)}")
        return user

    # --- components ------------------------------------------------------------------
    def _start(self, name: str, args: list[str], *, command: list[str] | None = None,
               env: dict[str, str] | None = None) -> _Component:
        log = self.log_of(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                command or [str(self.bin_dir / name), *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0 if self._pgid is None else self._pgid,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
                cwd=self.folder,
            )
        if self._pgid is None:
            self._pgid = process.pid
        component = _Component(name=name, process=process, log=log)
        self._components.append(component)
        return component

    def _fail(self, component: _Component, why: str) -> ControlPlaneError:
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(component.log.read_text(errors="replace").splitlines()[-15:])
        return ControlPlaneError(f"{component.name} {why}; its log is {component.log}\n{tail}")

    def _wait(self, component: _Component, probe, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if component.process.poll() is not None:
                raise self._fail(component, f"exited with code {component.process.returncode}")
            if probe():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise self._fail(component, f"did not become ready within {timeout:.0f}s")

    def _start_etcd(self, *, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client}"
        component = self._start(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait(component, lambda: _http_ok(f"{self._etcd_url}/health"), timeout=timeout)

    def _start_apiserver(self, *, timeout: float) -> None:
        assert self._pki is not None
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        token_file = self.folder / "tokens.csv"
        token_file.write_text(
            "".join(
                f'{self.tokens[key]},{user},{user},"{",".join(groups)}"\n'
                for key, (user, groups) in TEST_USERS.items()
            )
        )
        token_file.chmod(0o600)
        audit_policy = self.folder / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(_AUDIT_POLICY, sort_keys=False))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        component = self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={self._etcd_url}",
                f"--cert-dir={self.folder / 'pki'}",
                f"--tls-cert-file={self._pki.serving_cert}",
                f"--tls-private-key-file={self._pki.serving_key}",
                f"--client-ca-file={self._pki.ca_cert}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # No node-lifecycle controller runs to lift the not-ready taint that
                # TaintNodesByCondition puts on new nodes; kwok reports readiness instead.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://127.0.0.1/gpuops-testenv",
                f"--service-account-key-file={self._pki.sa_public_key}",
                f"--service-account-signing-key-file={self._pki.sa_private_key}",
                f"--token-auth-file={token_file}",
                # NB: the default endpoint reconciler refuses a loopback advertise address.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # written before the answer: read it right after a call
                "--v=1",
                *self.apiserver_args,
            ],
        )
        context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        context.load_cert_chain(str(self._pki.admin_cert), str(self._pki.admin_key))
        self._wait(
            component, lambda: _http_ok(f"{self.server}/readyz", context=context), timeout=timeout
        )

    def _write_kubeconfigs(self) -> None:
        assert self._pki is not None
        users = [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(self._pki.admin_cert),
                    "client-key": str(self._pki.admin_key),
                },
            }
        ] + [{"name": key, "user": {"token": self.tokens[key]}} for key in TEST_USERS]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuops-testenv",
                    "cluster": {"server": self.server, "certificate-authority": str(self._pki.ca_cert)},
                }
            ],
            "users": users,
            "contexts": [
                {"name": user["name"], "context": {"cluster": "gpuops-testenv", "user": user["name"]}}
                for user in users
            ],
            "current-context": "admin",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _controller_manager_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--concurrent-daemonset-syncs=4",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]

    def _kwok_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
            "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
            f"--config={_STAGES}",
        ]

    def _wait_controllers_running(self) -> None:
        # The last three have no readiness endpoint here (no serving port); give each a
        # moment and fail if any exited at start (bad flag, bad kubeconfig).
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for component in self._components:
                if component.process.poll() is not None:
                    raise self._fail(component, f"exited with code {component.process.returncode}")
            time.sleep(0.1)

    def start_operator(self, *, namespace: str = operator.NAMESPACE, timeout: float = 60.0) -> None:
        """Run the real GPU Operator (testenv.operator) in this control plane's process
        group, against its API server as admin: in a private mount namespace with the
        snapshot's operand manifests bound over /opt, leader election off, metrics and
        probes on free ports. Returns once it answers /readyz; a failure names its log."""
        binary = operator.operator_binary()
        root = operator.operand_root(self.folder)
        if shutil.which("unshare") is None:
            raise ControlPlaneError("the GPU Operator needs `unshare` (util-linux) to see its manifests at /opt")
        metrics, probes = free_port(), free_port()
        # Root (CI) binds /opt in a private mount namespace; elsewhere a user namespace
        # (`-r`) gives the same without touching the host.
        isolated = ["unshare", "-m", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["-r"])
        script = (f'mount --bind "{root}" /opt && exec "{binary}" --metrics-bind-address=127.0.0.1:{metrics} '
                  f"--health-probe-bind-address=127.0.0.1:{probes}")
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **operator.operator_environment(namespace)}
        component = self._start("gpu-operator", [], command=[*isolated, "sh", "-c", script], env=env)
        self._wait(component, lambda: _http_ok(f"http://127.0.0.1:{probes}/readyz"), timeout=timeout)

    def stop_operator(self, *, grace: float = 15.0) -> None:
        """Stop the GPU Operator started by start_operator; the control plane runs on."""
        for component in [c for c in self._components if c.name == "gpu-operator"]:
            component.process.terminate()
            try:
                component.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                component.process.kill()
                component.process.wait(timeout=5)
            self._components.remove(component)

    # --- state for other processes ---------------------------------------------------
    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision, as its periodic compaction would:
        watches from older resourceVersions then answer 410 Gone. Returns the revision."""
        def post(path: str, body: dict[str, object]) -> dict[str, object]:
            request = urllib.request.Request(f"{self._etcd_url}{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())

        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])  # type: ignore[index]
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def describe(self) -> dict[str, object]:
        return {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "folder": str(self.folder),
            "pgid": self._pgid,
            "pids": self.pids,
            "logs": {c.name: str(c.log) for c in self._components},
        }

    def write_state(self, path: Path, **extra: object) -> None:
        path.write_text(json.dumps({**self.describe(), **extra}, indent=2))


def _http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False
