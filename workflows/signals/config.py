"""What gpuops reads about GPU health signals: the DCGM exporters it scrapes, the Prometheus
it may read instead, and the thresholds a reading becomes a finding at (`signals:` of the
configuration, and of each cluster's entry)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import urllib.parse
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workflows.durations import Duration
from workflows.kube.labels import POD_SELECTOR_DCGM_EXPORTER
from workflows.prometheus.client import BasicAuth, Endpoint
from workflows.signals.analysis import PrometheusHealth
from workflows.signals.exporters import ClusterPods, ExporterPages, ExporterSettings
from workflows.signals.findings import Thresholds
from workflows.signals.health import ThrottleReason
from workflows.signals.rates import CounterMemory
from workflows.signals.service import SignalsService


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrometheusBasicAuth(_Model):
    username: str = Field(description=(
        "The user name for basic auth."))
    password_file: Path = Field(description=(
        "A file holding the password (a mounted Secret), read on every query."))


def _command_timeout(value: dt.timedelta) -> dt.timedelta:
    """A timeout a command waits out (reading Prometheus or an exporter)."""
    if not dt.timedelta(0) < value <= dt.timedelta(minutes=1):
        raise ValueError("the timeout must be more than 0 and at most 1m (a command waits for it)")
    return value


def http_address(value: str) -> str:
    """`value` if it is an http:// or https:// address with a host (a configuration key's
    check: Prometheus's URL, the documentation site's)."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http:// or https:// address")
    return value


class PrometheusConfig(_Model):
    url: str = Field(description=(
        "Prometheus's address, e.g. http://prometheus-operated.monitoring:9090 (a path prefix is "
        "kept)."))
    bearer_token_file: Path | None = Field(default=None, description=(
        "A file holding a bearer token (a ServiceAccount token, a mounted Secret), read on every "
        "query."))
    basic_auth: PrometheusBasicAuth | None = Field(default=None, description=(
        "Basic auth for Prometheus (a user name and a password file), instead of a bearer token."))
    ca_file: Path | None = Field(default=None, description=(
        "A CA bundle for an https URL signed by a private CA."))
    timeout: Duration = Field(default=dt.timedelta(seconds=5), description=(
        "One deadline for Prometheus's whole answer (connecting, headers, body); at most 1m."))

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_address(value)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: dt.timedelta) -> dt.timedelta:
        return _command_timeout(value)

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusConfig:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token_file or basic_auth, not both")
        return self

    def endpoint(self) -> Endpoint:
        return Endpoint(url=self.url, bearer_token_file=self.bearer_token_file,
                        basic_auth=BasicAuth(username=self.basic_auth.username,
                                             password_file=self.basic_auth.password_file)
                        if self.basic_auth else None,
                        ca_file=self.ca_file, timeout_seconds=self.timeout.total_seconds())


class ExportersConfig(_Model):
    """Each node's dcgm-exporter read straight from its pod, without Prometheus."""

    port: int = Field(default=9400, ge=1, le=65535, description=(
        "Where the exporter answers on its pod IP (the operator's: 9400, /metrics, plain HTTP)."))
    path: str = Field(default="/metrics", description=(
        "The path of the exporter's metrics page."))
    scheme: Literal["http", "https"] = Field(default="http", description=(
        "http, or https (needed for a bearer token or a CA file)."))
    timeout: Duration = Field(default=dt.timedelta(seconds=5), description=(
        "One deadline for one exporter's whole answer (connecting, headers, body); at most 1m."))
    namespace: str | None = Field(default=None, description=(
        "The exporter pods: in this namespace (unset: the GPU Operator's, as the cluster section or "
        "the ClusterPolicy says), with these labels. gpuops watches the operator's namespace only: "
        "exporters elsewhere are not seen."))
    pod_labels: dict[str, str] = Field(default_factory=lambda: {POD_SELECTOR_DCGM_EXPORTER[0]:
                                                                POD_SELECTOR_DCGM_EXPORTER[1]}, min_length=1, description=(
        "The labels that pick the exporter pods (the GPU Operator's: app=nvidia-dcgm-exporter)."))
    bearer_token_file: Path | None = Field(default=None, description=(
        "A file holding a bearer token (a mounted Secret), read on every scrape; a CA bundle for "
        "https (the exporters' certificates must name their pod IPs)."))
    ca_file: Path | None = Field(default=None, description=(
        "A CA bundle for https (the exporters' certificates must name their pod IPs)."))
    parallel: int = Field(default=16, ge=1, le=256, description=(
        "Pages read at once when every node is asked for (`/gpu findings`, a handover), and how long "
        "reading them all may take: pages not in by then leave their nodes unknown."))
    deadline: Duration = Field(default=dt.timedelta(seconds=20), description=(
        "How long reading every node's exporter may take; pages not in by then leave their nodes "
        "unknown (at least the timeout, at most 2m)."))

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or any(c in value for c in "?# "):
            raise ValueError(f"{value!r} is not a path such as /metrics")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: dt.timedelta) -> dt.timedelta:
        return _command_timeout(value)

    @model_validator(mode="after")
    def _deadline(self) -> ExportersConfig:
        if not self.timeout <= self.deadline <= dt.timedelta(minutes=2):
            raise ValueError("the deadline must be at least the timeout and at most 2m (a command waits for it)")
        return self

    @model_validator(mode="after")
    def _secrets_need_https(self) -> ExportersConfig:
        if self.scheme != "https" and self.ca_file is not None:
            raise ValueError("ca_file is for scheme https")
        if self.scheme != "https" and self.bearer_token_file is not None:
            raise ValueError("bearer_token_file needs scheme https (over http the token crosses the network readable)")
        return self

    def settings(self) -> ExporterSettings:
        return ExporterSettings(port=self.port, path=self.path, scheme=self.scheme,
                                timeout_seconds=self.timeout.total_seconds(), namespace=self.namespace,
                                pod_labels=dict(self.pod_labels), bearer_token_file=self.bearer_token_file,
                                ca_file=self.ca_file, parallel=self.parallel,
                                deadline_seconds=self.deadline.total_seconds())


class SignalThresholdsConfig(_Model):
    gpu_temp_warning_c: float = Field(default=85.0, gt=0, description=(
        "GPU temperature (Celsius) that raises a `gpu-hot` warning."))
    gpu_temp_critical_c: float = Field(default=92.0, gt=0, description=(
        "GPU temperature (Celsius) that makes `gpu-hot` critical."))
    memory_temp_warning_c: float = Field(default=95.0, gt=0, description=(
        "GPU memory temperature (Celsius) that raises a `gpu-memory-hot` warning."))
    memory_temp_critical_c: float = Field(default=105.0, gt=0, description=(
        "GPU memory temperature (Celsius) that makes `gpu-memory-hot` critical."))
    ecc_dbe_critical: int = Field(default=1, ge=1, description=(
        "A count since the driver last loaded (DCGM's volatile counter)."))
    ecc_sbe_warning: int = Field(default=100, ge=1, description=(
        "Per hour: how fast correctable ECC errors and PCIe replays grow, not their totals."))
    pcie_replays_warning: int = Field(default=100, ge=1, description=(
        "PCIe replays per hour that raise a `gpu-pcie-replays` warning."))
    throttle_reasons: tuple[ThrottleReason, ...] = Field(default=("thermal (SW)", "thermal (HW)", "HW slowdown",
                                                    "power brake (HW)"), description=(
        "Clock-throttle reasons that raise a finding (power capping under load is normal)."))

    @model_validator(mode="after")
    def _ordered(self) -> SignalThresholdsConfig:
        if self.gpu_temp_critical_c < self.gpu_temp_warning_c:
            raise ValueError("gpu_temp_critical_c is below gpu_temp_warning_c")
        if self.memory_temp_critical_c < self.memory_temp_warning_c:
            raise ValueError("memory_temp_critical_c is below memory_temp_warning_c")
        return self

    def thresholds(self) -> Thresholds:
        return Thresholds(**self.model_dump())


class SignalsConfig(_Model):
    """GPU health from DCGM: the dcgm-exporter's series, read through Prometheus
    (`prometheus`) or straight from the exporter pods (`exporters`); exactly one."""

    prometheus: PrometheusConfig | None = Field(default=None, description=(
        "Read the DCGM series through Prometheus (or Thanos) that scrapes the exporters."))
    exporters: ExportersConfig | None = Field(default=None, description=(
        "Read each node's dcgm-exporter pod directly, by its pod IP (the home cluster only)."))
    node_label: str = Field(default="Hostname", min_length=1, description=(
        "The series label naming the Kubernetes node (the GPU Operator's exporter sets Hostname to "
        "it; a scrape that relabels, e.g. to `node`, names its own). Through Prometheus only: read "
        "from the exporters, a node's series are its exporter pod's."))
    matchers: dict[str, str] = Field(default_factory=dict, description=(
        "Label matchers every query carries, where one Prometheus (or Thanos) holds several clusters' "
        "series, e.g. {cluster: west}. Through Prometheus only."))
    thresholds: SignalThresholdsConfig = Field(default=SignalThresholdsConfig(), description=(
        "Where a GPU's readings become findings."))
    max_answer_mb: int = Field(default=8, ge=1, le=1000, description=(
        "The longest answer read from Prometheus or one exporter's page, in MB (10^6 bytes); a longer "
        "one is not read on: that reading (or that node) is unknown, with the reason."))

    @model_validator(mode="after")
    def _one_source(self) -> SignalsConfig:
        if (self.prometheus is None) == (self.exporters is None):
            raise ValueError("give prometheus (a Prometheus that scrapes the exporters) or exporters (each node's "
                             "dcgm-exporter pod read directly), exactly one")
        if self.exporters is not None and "node_label" in self.model_fields_set:
            raise ValueError("node_label is for prometheus: read from the exporters, the node is the pod's")
        if self.exporters is not None and self.matchers:
            raise ValueError("matchers are for prometheus: read from the exporters, the series are the pods'")
        for label in self.matchers:
            if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", label):
                raise ValueError(f"matchers: {label!r} is not a Prometheus label name")
        return self

    def health_queries(self) -> PrometheusHealth | None:
        """The reader of the pools' analysis queries (None: no Prometheus to read them)."""
        if self.prometheus is None:
            return None
        return PrometheusHealth(endpoint=dataclasses.replace(self.prometheus.endpoint(),
                                                             max_answer_bytes=self.max_answer_mb * 1_000_000))

    def service(self, *, cluster: object | None = None, memory: CounterMemory | None = None) -> SignalsService:
        """The reader. `cluster`, where it can give a snapshot of the pods (the watch
        cache), is where the exporter pods are found; `memory` keeps the counters' last
        readings for their rates, so give the same one to every service of a process."""
        cap = self.max_answer_mb * 1_000_000
        if self.prometheus is not None:
            return SignalsService(endpoint=dataclasses.replace(self.prometheus.endpoint(), max_answer_bytes=cap),
                                  thresholds=self.thresholds.thresholds(), node_label=self.node_label,
                                  matchers=self.matchers)
        assert self.exporters is not None  # _one_source
        pages = ExporterPages(settings=dataclasses.replace(self.exporters.settings(), max_answer_bytes=cap),
                              cluster=cluster if isinstance(cluster, ClusterPods) else None,
                              memory=memory if memory is not None else CounterMemory())
        return SignalsService(exporters=pages, thresholds=self.thresholds.thresholds())
