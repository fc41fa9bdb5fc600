"""A validating admission webhook served by the test: the API server's own way of
answering a write with 429, 500 or 409, and the record of every write it let through.

`RefusingWebhook` serves HTTPS on 127.0.0.1 (a throwaway CA and a serving certificate
for that address, made here) and registers a ValidatingWebhookConfiguration for the
writes gpuops makes: node patches, evictions, pod creates and deletes, and patches of
ClusterPolicies and NVIDIADrivers. Only requests from `user` reach it (a matchCondition
on the requesting user), so the control plane's own controllers, the simulator and the
test's admin client are never refused. A seeded generator refuses `share` of them, each
with one of `codes` and a message saying so; the API server hands the webhook's code and
message to the client ("admission webhook ... denied the request: ...").

Every request it allowed is kept (`allowed`) once the API server has read the answer:
who, what operation, which object, and for a node patch what changed (cordon, uncordon,
the gpuops cordon mark on or off, labels).
That is the ground truth for "no side effect twice": a write the client sent again after
losing the answer to a fault shows up here twice, whatever the client believed.

failurePolicy is Fail: a webhook that cannot answer refuses the write rather than let
one through unrecorded (the record may then count a write the server did not make,
never miss one it made). `stop()` removes the configuration before the server stops."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import random
import ssl
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testenv.controlplane import free_port
from testenv.install import Installer

_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CORDON_MARK = "gpuops.io/cordoned-by"

# The writes gpuops makes, as admission sees them (a merge patch is an UPDATE).
RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"],
     "scope": "Cluster"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"],
     "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "DELETE"], "resources": ["pods"],
     "scope": "Namespaced"},
    {"apiGroups": ["nvidia.com"], "apiVersions": ["*"], "operations": ["UPDATE"],
     "resources": ["clusterpolicies", "nvidiadrivers"], "scope": "Cluster"},
)
_REASONS = {429: "TooManyRequests", 500: "InternalError", 409: "Conflict"}


@dataclass(frozen=True)
class Admitted:
    """One write the webhook let through (or, with `refused`, turned away)."""

    user: str
    operation: str  # CREATE | UPDATE | DELETE
    resource: str  # "nodes", "pods/eviction", "pods", "nvidiadrivers", ...
    namespace: str
    name: str
    dry_run: bool
    # A node patch: "cordon", "uncordon", "mark", "unmark", "labels", "annotations" or
    # "none"; a pod: its uid (an eviction names it in its preconditions); a driver
    # object: "version a -> b".
    change: str
    refused: int | None = None
    # A pod DELETE whose old object already has a deletionTimestamp: the API server's
    # second look at one delete request. A pod deleted at once (finished, unscheduled:
    # no grace period) is validated when its deletion timestamp is set and again when it
    # is removed (k8s.io/apiserver's Store.Delete); a second client DELETE of a pod
    # already terminating is not validated at all. So this is never a second request.
    second_pass: bool = False
    # The resourceVersion of the object the change was admitted against (UPDATE,
    # DELETE): two admissions of one change against the same version cannot both have
    # been stored (etcd compares and swaps), so they are one side effect. It happens when
    # the server cancels a request after admitting it (its client went away: a 504) and
    # the client sends it again.
    old_version: str = ""

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def node_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What a node patch changed, as the duplicate count names it."""
    was, now = bool((old.get("spec") or {}).get("unschedulable")), bool((new.get("spec") or {}).get("unschedulable"))
    if not was and now:
        return "cordon"
    if was and not now:
        return "uncordon"
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    old_mark = (old_meta.get("annotations") or {}).get(CORDON_MARK)
    new_mark = (new_meta.get("annotations") or {}).get(CORDON_MARK)
    if old_mark != new_mark:
        return "mark" if new_mark else "unmark"
    if (old_meta.get("labels") or {}) != (new_meta.get("labels") or {}):
        return "labels"
    if (old_meta.get("annotations") or {}) != (new_meta.get("annotations") or {}):
        return "annotations"
    return "none"


def _driver_version(obj: dict[str, Any]) -> str | None:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "ClusterPolicy":
        return (spec.get("driver") or {}).get("version")
    return spec.get("version")


def describe(request: dict[str, Any]) -> Admitted:
    """An AdmissionReview's request as the record keeps it."""
    kind = request.get("resource") or {}
    resource = kind.get("resource", "?") + (f"/{request['subResource']}" if request.get("subResource") else "")
    new, old = request.get("object") or {}, request.get("oldObject") or {}
    change, second_pass = "", False
    if resource == "nodes":
        change = node_change(old, new)
    elif resource == "pods/eviction":
        change = str(((new.get("deleteOptions") or {}).get("preconditions") or {}).get("uid") or "")
    elif resource == "pods":
        change = str((old or new).get("metadata", {}).get("uid") or "")
        second_pass = request["operation"] == "DELETE" and bool((old.get("metadata") or {}).get("deletionTimestamp"))
    elif resource in ("clusterpolicies", "nvidiadrivers"):
        change = f"version {_driver_version(old)} -> {_driver_version(new)}"
    return Admitted(user=str((request.get("userInfo") or {}).get("username", "")), operation=str(request["operation"]),
                    resource=resource, namespace=str(request.get("namespace") or ""),
                    name=str(request.get("name") or ""), dry_run=bool(request.get("dryRun")), change=change,
                    second_pass=second_pass, old_version=str((old.get("metadata") or {}).get("resourceVersion") or ""))


@dataclass
class RefusingWebhook:
    """Serve with `start(installer)`, read `allowed` / `refusals`, then `stop()`."""

    name: str
    user: str
    seed: int
    share: float = 0.1
    codes: Sequence[int] = (429, 500, 409)
    timeout_seconds: int = 10
    allowed: list[Admitted] = field(default_factory=list)
    refusals: list[Admitted] = field(default_factory=list)
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)
    _installer: Installer | None = field(default=None, repr=False)
    refusing: bool = True  # False: let everything through (still recorded)
    undelivered: int = 0  # answers the API server hung up before reading

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    # --- deciding ----------------------------------------------------------------------
    def decide(self, request: dict[str, Any]) -> tuple[dict[str, Any], Admitted]:
        """The webhook's answer to one AdmissionReview request, and the entry to keep
        once the API server has it (`keep`)."""
        seen = describe(request)
        with self._lock:
            # NB: dry runs are drawn too, so the sequence of draws does not depend on
            # whether a dry run happened to be sent.
            refuse = self.refusing and not seen.dry_run and self._rng.random() < self.share
            code = self._rng.choice(list(self.codes)) if refuse else None
        if code is None:
            return {"uid": request["uid"], "allowed": True}, seen
        return ({"uid": request["uid"], "allowed": False,
                 "status": {"code": code, "reason": _REASONS.get(code, ""),
                            "message": f"gpuops fault test: {request['operation'].lower()} of {seen.resource} "
                                       f"{seen.target} refused with {code}"}},
                Admitted(**{**seen.__dict__, "refused": code}))

    def keep(self, entry: Admitted) -> None:
        with self._lock:
            (self.allowed if entry.refused is None else self.refusals).append(entry)

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        """`decide` and `keep` at once (the answer is taken as delivered)."""
        answer, entry = self.decide(request)
        self.keep(entry)
        return answer

    def writes(self, *, since: int = 0) -> list[Admitted]:
        """The writes let through from the `since`th on, dry runs left out, and each
        change admitted again against the version it was first admitted against (see
        `Admitted.old_version`) counted once."""
        with self._lock:
            found, seen = [], set()
            for entry in self.allowed[since:]:
                if entry.dry_run:
                    continue
                key = (entry.operation, entry.resource, entry.target, entry.change, entry.old_version)
                if entry.old_version and key in seen:
                    continue
                seen.add(key)
                found.append(entry)
            return found

    def mark(self) -> int:
        with self._lock:
            return len(self.allowed)

    # --- serving -----------------------------------------------------------------------
    def start(self, installer: Installer) -> RefusingWebhook:
        ca_pem, cert_pem, key_pem = _certificates()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="gpuops-webhook-") as work:  # ssl reads files only
            (Path(work) / "tls.crt").write_bytes(cert_pem)
            (Path(work) / "tls.key").write_bytes(key_pem)
            context.load_cert_chain(Path(work) / "tls.crt", Path(work) / "tls.key")
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                response, entry = webhook.decide(body["request"])
                answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                     "response": response}).encode()
                try:
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    self.wfile.flush()
                except OSError:
                    # NB: the API server gave up on the call (its client went away and the
                    # request was cancelled): it never had the answer, and with
                    # failurePolicy Fail nothing was written. Not kept.
                    webhook.undelivered += 1
                    self.close_connection = True
                    return
                webhook.keep(entry)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        port = free_port()
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="refusing-webhook", daemon=True).start()
        self._server = server
        self._installer = installer
        installer.call("POST", _CONFIGURATIONS, body={
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [{
                "name": f"{self.name}.faults.gpuops.io",
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                                 "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": list(RULES),
                "matchConditions": [{"name": "only-the-test-identity",
                                     "expression": f"request.userInfo.username == {json.dumps(self.user)}"}],
                "failurePolicy": "Fail",
                "sideEffects": "None",  # dry runs may reach it: it only records
                "timeoutSeconds": self.timeout_seconds,
                "admissionReviewVersions": ["v1"],
            }],
        })
        return self

    def stop(self) -> None:
        if self._installer is not None:
            try:
                self._installer.call("DELETE", f"{_CONFIGURATIONS}/{self.name}")
            except Exception:  # noqa: BLE001 - gone already; nothing else to take away
                pass
            self._installer = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _certificates() -> tuple[bytes, bytes, bytes]:
    """A throwaway CA and a serving certificate for 127.0.0.1: (CA, certificate, key), PEM."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuops-fault-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuops-fault-webhook")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
