"""One running test environment: the control plane, the GPU Operator CRDs, the real GPU
Operator (started with the first fleet that wants it), a fleet and the operand
simulator, with API clients for each test identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from testenv import build, operator
from testenv import fleet as fl
from testenv.controlplane import ControlPlane
from testenv.install import Installer, apply_fleet, create_crds, delete_fleet, install_crds, wait_until
from testenv.simulator import OperandSimulator, SimulatorTiming


@dataclass
class Environment:
    folder: Path
    die_with_parent: bool = True
    plane: ControlPlane = field(init=False)
    simulator: OperandSimulator | None = None
    fleet: fl.FleetSpec | None = None
    crds_installed: bool = False
    # The namespace the running GPU Operator serves, None while it is not running.
    operator_namespace: str | None = None

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
        self.operator_namespace = None

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

    def start_operator(self, namespace: str = operator.NAMESPACE) -> None:
        """Run the real GPU Operator for `namespace`; one running for another namespace
        is stopped first, one for this namespace kept. Its CRDs must be installed
        (install_operator_crds)."""
        if self.operator_namespace == namespace:
            return
        self.stop_operator()
        self.plane.start_operator(namespace=namespace)
        self.operator_namespace = namespace

    def stop_operator(self) -> None:
        """Stop the real GPU Operator, if it runs: with no fleet (or a stand-in fleet) its
        upgrade controller would still relabel every GPU node it finds."""
        if self.operator_namespace is not None:
            self.plane.stop_operator()
            self.operator_namespace = None

    def install_operator_crds(self) -> None:
        """The chart's CRDs (ClusterPolicy, NVIDIADriver, GPUCluster, ...), all the operator watches."""
        create_crds(self.installer(), operator.operator_crds())
        self.crds_installed = True

    def apply_fleet(self, spec: fl.FleetSpec, *, simulate: bool = True, advertise: bool = False) -> None:
        """Create the fleet and, for a fleet on the real operator, start the operator
        (after its ClusterPolicy exists, as after a Helm install)."""
        if spec.operator.real:
            self.install_operator_crds()
        else:
            self.stop_operator()
            if spec.operator.installed and not self.crds_installed:
                self.install_crds()
        self.fleet = spec
        if simulate and self.simulator is None:
            self.simulator = OperandSimulator(
                self.api_client(), namespace=spec.operator.namespace,
                timing=SimulatorTiming(driver_ready_seconds=spec.driver_ready_seconds,
                                       validator_ready_seconds=spec.validator_ready_seconds,
                                       mig_apply_seconds=spec.mig_apply_seconds),
                nudge_node=fl.system_node_name(1) if spec.nudge_upgrade_controller else None,
            ).start()
        apply_fleet(self.installer(), spec, advertise=advertise)
        if spec.operator.real:
            self.start_operator(spec.operator.namespace)
            self._wait_operator_took(spec)

    def _wait_operator_took(self, spec: fl.FleetSpec, timeout: float | None = None) -> None:
        """Wait until the operator has labelled every GPU node of the fleet as its own
        (`nvidia.com/gpu.present=true`), so a test starts from the operator's state. The
        operator labels a few nodes a second, more slowly with thousands of other nodes in
        the cluster (the benchmarks'): by default a minute and a second a node."""
        installer = self.installer()
        names = set(spec.node_names())
        timeout = timeout if timeout is not None else 60.0 + len(names)

        def labelled() -> set[str]:
            nodes = installer.list("Node", selector=f"{fl.FLEET_LABEL}={spec.name},nvidia.com/gpu.present=true")
            return names - {n["metadata"]["name"] for n in nodes}

        try:
            wait_until(lambda: not labelled(), timeout=timeout, what="the GPU Operator to label the fleet's nodes")
        except TimeoutError as err:
            log = self.plane.log_of("gpu-operator")
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.is_file() else ""
            raise TimeoutError(f"{err}; not labelled: {sorted(labelled())}; its log is {log}\n{tail}") from None

    def delete_fleet(self) -> None:
        self.stop_operator()
        if self.simulator is not None:
            self.simulator.stop()
            self.simulator = None
        delete_fleet(self.installer())
        self.fleet = None
