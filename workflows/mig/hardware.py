"""What gpuops knows of GPU models for MIG: the PCI device id mig-parted matches a
layout's `device-filter` against, and the MIG profiles the model can make (NVIDIA's MIG
user guide, "Supported MIG Profiles"). The node tells gpuops its model only by GFD's
`nvidia.com/gpu.product` label; the counts a layout makes come from the mig-parted
config itself, never from here.

A model missing here is not refused: the plan says gpuops cannot check it, and the MIG
manager's own `failed` state halts the run if the GPU cannot make the layout."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    device_id: str  # as mig-parted writes it in device-filter, e.g. 0x20B210DE
    profiles: frozenset[str]  # without the "+me" media-extension suffix


_A100_40GB = frozenset({"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"})
_80GB = frozenset({"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"})
_94GB = frozenset({"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"})
_141GB = frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"})

MODELS: dict[str, GpuModel] = {
    "NVIDIA-A30": GpuModel("0x20B710DE", frozenset({"1g.6gb", "2g.12gb", "4g.24gb"})),
    "NVIDIA-A100-SXM4-40GB": GpuModel("0x20B010DE", _A100_40GB),
    "NVIDIA-A100-PCIE-40GB": GpuModel("0x20F110DE", _A100_40GB),
    "NVIDIA-A100-SXM4-80GB": GpuModel("0x20B210DE", _80GB),
    "NVIDIA-A100-80GB-PCIe": GpuModel("0x20B510DE", _80GB),
    "NVIDIA-H100-80GB-HBM3": GpuModel("0x233010DE", _80GB),
    "NVIDIA-H100-PCIe": GpuModel("0x233110DE", _80GB),
    "NVIDIA-H100-NVL": GpuModel("0x232110DE", _94GB),
    "NVIDIA-H200": GpuModel("0x233510DE", _141GB),
    "NVIDIA-H200-NVL": GpuModel("0x233B10DE", _141GB),
}


def model_name(product: str) -> str:
    """GFD's product label without what sharing adds: "-SHARED" (time-slicing renamed)
    and "-MIG-<profile>" (the single strategy)."""
    base = product.removesuffix("-SHARED")
    return base.split("-MIG-", 1)[0]


def model_of(product: str | None) -> GpuModel | None:
    return MODELS.get(model_name(product)) if product else None


def base_profile(profile: str) -> str:
    """"1g.10gb+me" -> "1g.10gb"."""
    return profile.split("+", 1)[0]


def resource_of(profile: str) -> str:
    """The device plugin's resource for a MIG profile under the mixed strategy ("+" is not
    allowed in a resource name: "1g.10gb+me" -> nvidia.com/mig-1g.10gb.me)."""
    return "nvidia.com/mig-" + profile.replace("+", ".")
