"""The MIG manager's layouts, read from its mig-parted config (the ConfigMap the
ClusterPolicy's `migManager.config.name` names, `default-mig-parted-config` by default):
`version: v1` and `mig-configs: {<layout>: [{devices, mig-enabled, mig-devices,
device-filter?}]}`. Each GPU of a node takes the entries whose `devices` (all, or a list
of GPU indexes) and `device-filter` (PCI device ids) match it, as mig-parted does.

`MigLayouts.resources` says what a node advertises once a layout is applied, per device
plugin resource, under the pool's MIG strategy: mixed, one `nvidia.com/mig-<profile>` per
profile (and `nvidia.com/gpu` for GPUs left whole); single, `nvidia.com/gpu` counting the
MIG devices (every GPU must then make one and the same profile)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from workflows.kube.objects import GPU_RESOURCE
from workflows.mig import hardware
from workflows.mig import messages as say



class MigRefused(Exception):
    """A MIG change that cannot be planned: `reason` says why and what to do."""

    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class LayoutEntry:
    devices: tuple[int, ...] | None  # None: every GPU
    enabled: bool
    profiles: Mapping[str, int]
    device_filter: frozenset[str] | None  # upper-case PCI device ids; None: any

    def takes(self, index: int, device_id: str | None) -> bool:
        if self.devices is not None and index not in self.devices:
            return False
        return self.device_filter is None or (device_id or "").upper() in self.device_filter


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """A layout applied to one node's GPUs: MIG devices per profile and whole GPUs."""

    profiles: Mapping[str, int]
    whole_gpus: int


@dataclass(frozen=True, slots=True)
class MigLayouts:
    source: str  # "ConfigMap gpu-operator/default-mig-parted-config"
    layouts: Mapping[str, tuple[LayoutEntry, ...]]

    @classmethod
    def parse(cls, config_yaml: str, *, source: str) -> MigLayouts:
        try:
            document = yaml.safe_load(config_yaml)
        except yaml.YAMLError as err:
            raise MigRefused(say.config_unreadable(source, str(err).splitlines()[0]), code="mig-config") from None
        configs = document.get("mig-configs") if isinstance(document, Mapping) else None
        if not isinstance(configs, Mapping) or not configs:
            raise MigRefused(say.config_unreadable(source, "no mig-configs in it"), code="mig-config")
        layouts = {}
        for name, entries in configs.items():
            if not isinstance(entries, Sequence) or isinstance(entries, str):
                raise MigRefused(say.config_unreadable(source, f"layout {name} is not a list"), code="mig-config")
            layouts[str(name)] = tuple(_entry(source, str(name), e) for e in entries)
        return cls(source=source, layouts=layouts)

    def names(self) -> list[str]:
        return sorted(self.layouts)

    def apply(self, layout: str, *, product: str | None, gpus: int) -> NodeLayout:
        """The MIG devices `layout` makes of `gpus` x `product`, or MigRefused: an unknown
        layout (with the ones that fit this GPU), a GPU no entry takes, a profile the
        model cannot make."""
        if layout not in self.layouts:
            offered = self.offered(product=product, gpus=gpus)
            raise MigRefused(say.unknown_layout(layout, self.source, product, offered, self.names()),
                             code="unknown-layout")
        model = hardware.model_of(product)
        device_id = model.device_id if model is not None else None
        profiles: dict[str, int] = {}
        whole = 0
        for index in range(gpus):
            taken = [e for e in self.layouts[layout] if e.takes(index, device_id)]
            if not taken:
                raise MigRefused(say.no_entry_for_gpu(layout, index, product, device_id), code="layout-not-for-gpu")
            if not any(e.enabled for e in taken):
                whole += 1
                continue
            for entry in taken:
                for profile, count in entry.profiles.items():
                    if model is not None and hardware.base_profile(profile) not in model.profiles:
                        raise MigRefused(say.profile_not_made(layout, profile, product or "?", model.profiles),
                                         code="layout-not-for-gpu")
                    profiles[profile] = profiles.get(profile, 0) + count
        return NodeLayout(profiles=profiles, whole_gpus=whole)

    def offered(self, *, product: str | None, gpus: int) -> list[str]:
        """The layouts this node's GPUs can take."""
        fits = []
        for name in self.names():
            try:
                self.apply(name, product=product, gpus=gpus)
            except MigRefused:
                continue
            fits.append(name)
        return fits


def resources(applied: NodeLayout, *, strategy: str | None, layout: str) -> dict[str, int]:
    """What the device plugin advertises for `applied` under the MIG `strategy`."""
    if not applied.profiles:
        return {GPU_RESOURCE: applied.whole_gpus} if applied.whole_gpus else {}
    if strategy == "single":
        if len(applied.profiles) > 1 or applied.whole_gpus:
            raise MigRefused(say.single_strategy_mixed(layout, sorted(applied.profiles)), code="single-strategy")
        return {GPU_RESOURCE: sum(applied.profiles.values())}
    if strategy != "mixed":
        raise MigRefused(say.no_mig_strategy(strategy), code="mig-strategy")
    found = {hardware.resource_of(p): n for p, n in applied.profiles.items() if n}
    if applied.whole_gpus:
        found[GPU_RESOURCE] = applied.whole_gpus
    return found


def _entry(source: str, layout: str, raw: Any) -> LayoutEntry:
    if not isinstance(raw, Mapping):
        raise MigRefused(say.config_unreadable(source, f"layout {layout} has an entry that is not a map"),
                         code="mig-config")
    devices = raw.get("devices", "all")
    if devices == "all":
        indexes = None
    elif isinstance(devices, Sequence) and not isinstance(devices, str) and all(isinstance(d, int) for d in devices):
        indexes = tuple(devices)
    else:
        raise MigRefused(say.config_unreadable(source, f"layout {layout}: devices must be all or a list of GPU "
                                                       f"indexes, not {devices!r}"), code="mig-config")
    wanted = raw.get("device-filter")
    device_filter = None if wanted is None else frozenset(
        str(d).upper() for d in ([wanted] if isinstance(wanted, str) else wanted))
    profiles = raw.get("mig-devices") or {}
    if not isinstance(profiles, Mapping) or not all(isinstance(n, int) and n >= 0 for n in profiles.values()):
        raise MigRefused(say.config_unreadable(source, f"layout {layout}: mig-devices must map profiles to counts"),
                         code="mig-config")
    return LayoutEntry(devices=indexes, enabled=bool(raw.get("mig-enabled")),
                       profiles={str(p): int(n) for p, n in profiles.items()}, device_filter=device_filter)
