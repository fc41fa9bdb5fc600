"""One running test environment: the control plane, the GPU Operator CRDs, a fleet and
the operand simulator, with API clients for each test identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from testenv import build
from testenv import fleet as fl
from testenv.controlplane import ControlPlane
from testenv.install import Installer, apply_fleet, delete_fleet, install_crds
from testenv.simulator import OperandSimulator, SimulatorTiming


@dataclass
class Environment:
    folder: Path
    die_with_parent: bool = True
    plane: ControlPlane = field(init=False)
    simulator: OperandSimulator | None = None
    fleet: fl.FleetSpec | None = None
    crds_installed: bool = False

    def __post_init__(self) -> None:
        self.plane = ControlPlane(bin_dir=build.ensure_binaries(), folder=self.folder,
                                  die_with_parent=self.die_with_parent)

    def start(self) -> Environment:
        self.plane.start()
        return self

    def stop(self) -> None:
        if self.simulator is not None:
            self.simulator.stop()
            self.simulator = None
        self.plane.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def api_client(self, user: str = "admin") -> client.ApiClient:
        """A client authenticated as `user`: "admin" (system:masters) or a test identity
        ("bot" is the gpuops ServiceAccount, "alice", "bob")."""
        return config.new_client_from_config(
            config_file=str(self.kubeconfig), context=self.plane.kubeconfig_context(user)
        )

    def installer(self) -> Installer:
        return Installer(self.api_client())

    def install_crds(self, folder: Path | None = None) -> None:
        install_crds(self.installer(), folder)
        self.crds_installed = True

    def apply_fleet(self, spec: fl.FleetSpec, *, simulate: bool = True, advertise: bool = False) -> None:
        if spec.operator.installed and not self.crds_installed:
            self.install_crds()
        self.fleet = spec
        if simulate and self.simulator is None:
            self.simulator = OperandSimulator(
                self.api_client(), namespace=spec.operator.namespace,
                timing=SimulatorTiming(driver_ready_seconds=spec.driver_ready_seconds,
                                       validator_ready_seconds=spec.validator_ready_seconds,
                                       mig_apply_seconds=spec.mig_apply_seconds),
            ).start()
        apply_fleet(self.installer(), spec, advertise=advertise)

    def delete_fleet(self) -> None:
        if self.simulator is not None:
            self.simulator.stop()
            self.simulator = None
        delete_fleet(self.installer())
        self.fleet = None
