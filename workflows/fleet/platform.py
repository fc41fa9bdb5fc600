"""The platform under the GPU Operator: which Kubernetes versions NVIDIA supports it on
(by release line), and how a node's Kubernetes, container runtime and kernel read.

The support table ships as `operator_support.yaml` beside this module (each row names the
page and commit it was read from); configuration overrides or extends it per release line
(`inventory.operator_support`). A release line the table does not know stays unknown: it
is never taken as supported.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Literal, TypeAlias

import yaml

KubeMinor: TypeAlias = tuple[int, int]
# What the GPU Operator calls the runtimes it configures the container toolkit for (its
# `Runtime` type and the toolkit's RUNTIME variable).
RuntimeKind: TypeAlias = Literal["docker", "containerd", "crio"]

_MINOR = re.compile(r"^v?(\d+)\.(\d+)", re.ASCII)
_RANGE = re.compile(r"^\s*(\d+)\.(\d+)\s*(?:-+\s*(\d+)\.(\d+)\s*)?$", re.ASCII)
SUPPORT_FILE = "operator_support.yaml"


def minor_of(version: str | None) -> KubeMinor | None:
    """(1, 31) from "v1.31.4", "v1.31.4-eks-1234" or "1.31"; (25, 10) from "v25.10.1"."""
    match = _MINOR.match(version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def release_line(operator_version: str | None) -> str | None:
    """The GPU Operator release line of an image tag: "25.10" from "v25.10.1"."""
    minor = minor_of(operator_version)
    return f"{minor[0]}.{minor[1]}" if minor else None


def minor_text(minor: KubeMinor) -> str:
    return f"{minor[0]}.{minor[1]}"


@dataclass(frozen=True, slots=True)
class KubernetesRange:
    """Kubernetes minor versions from `low` to `high`, both included."""

    low: KubeMinor
    high: KubeMinor
    source: str = ""

    @classmethod
    def parse(cls, text: str, *, source: str = "") -> KubernetesRange:
        """"1.30-1.35" (or "1.30---1.35" as NVIDIA's page writes it), or one "1.31"."""
        match = _RANGE.match(text)
        if not match:
            raise ValueError(f"{text!r} is not a Kubernetes range such as 1.30-1.35")
        low = (int(match.group(1)), int(match.group(2)))
        high = (int(match.group(3)), int(match.group(4))) if match.group(3) else low
        if high < low:
            raise ValueError(f"{text!r} ends before it starts")
        return cls(low=low, high=high, source=source)

    def contains(self, minor: KubeMinor) -> bool:
        return self.low <= minor <= self.high

    @property
    def text(self) -> str:
        return minor_text(self.low) if self.low == self.high else f"{minor_text(self.low)}-{minor_text(self.high)}"


def parse_support_table(data: object, *, where: str) -> dict[str, KubernetesRange]:
    """`releases: {"25.10": {kubernetes: "1.30-1.35", source: "..."}}` -> line -> range.
    Raises ValueError naming `where` and the release line at fault."""
    releases = data.get("releases") if isinstance(data, Mapping) else None
    if not isinstance(releases, Mapping):
        raise ValueError(f"{where}: expected a mapping under `releases`")
    table: dict[str, KubernetesRange] = {}
    for line, row in releases.items():
        if release_line(str(line)) != str(line):
            raise ValueError(f"{where}: release line {line!r} is not YY.MM such as 25.10")
        if not isinstance(row, Mapping) or not isinstance(row.get("kubernetes"), str):
            raise ValueError(f"{where}: release line {line}: expected `kubernetes: \"1.30-1.35\"`")
        try:
            table[str(line)] = KubernetesRange.parse(row["kubernetes"], source=str(row.get("source") or where))
        except ValueError as err:
            raise ValueError(f"{where}: release line {line}: {err}") from None
    return table


@functools.cache
def shipped_operator_support() -> Mapping[str, KubernetesRange]:
    """The support table gpuops ships (`operator_support.yaml`)."""
    text = resources.files(__package__).joinpath(SUPPORT_FILE).read_text(encoding="utf-8")
    return MappingProxyType(parse_support_table(yaml.safe_load(text), where=f"{__package__}/{SUPPORT_FILE}"))


def runtime_of(container_runtime_version: str) -> str | None:
    """The runtime a node's `nodeInfo.containerRuntimeVersion` names, as the GPU Operator
    reads it ("containerd://1.7.20" -> containerd, "cri-o://1.30.4" -> crio): one of
    `RuntimeKind`, the unrecognised scheme itself, or None when the kubelet reports none."""
    if not container_runtime_version:
        return None
    scheme = container_runtime_version.split("://", 1)[0]
    # The operator matches prefixes (getRuntimeString): docker, containerd, cri-o.
    for prefix, kind in (("docker", "docker"), ("containerd", "containerd"), ("cri-o", "crio")):
        if scheme.startswith(prefix):
            return kind
    return scheme


def is_known_runtime(kind: str | None) -> bool:
    return kind in ("docker", "containerd", "crio")
