"""The operand simulator: plays what the GPU Operator's operand containers and the GPU
hardware do on a node (the part kwok cannot), against the real API server. The
operator's own work (deploy labels, DaemonSets, upgrade labels) is the real operator's.

It watches kwok nodes, the operand pods of the operator's namespace (known by the labels
the operator's manifests give them) and its ConfigMaps, and per node:
- a driver pod becomes Running and Ready after a delay and then sets the node's
  `nvidia.com/cuda.driver-version.*` labels from its image tag; a driver version listed
  in the faults ConfigMap crash-loops, and so does every driver pod on a node that also
  has a host driver (two driver sources); a driver image whose tag names a kernel the
  faults ConfigMap lists as without a precompiled image cannot be pulled;
- while a node has no ready driver (pod or host driver) it advertises 0 GPUs, and once the
  device plugin is ready again it re-advertises the full count (or the count a fault
  annotation says);
- the validator becomes Ready a (configurable) moment after the driver, or never on a node
  marked `validator-fails` (its CUDA validation init container crash-loops);
- while a driver works, GFD's labels removed from a node come back (from what the node was
  made with, `sim.gpuops.io/gfd-labels`; a value a person set by hand is left alone), and
  the GPUs a node has are that record's, whatever its labels say;
- a change of `nvidia.com/mig.config` goes pending (operands paused, 0 advertised), then
  success with the MIG devices the operator's mig-parted ConfigMap
  (`default-mig-parted-config`) makes of the node's GPUs, unless the node is marked stuck;
  a layout that ConfigMap does not have for the GPU fails (`mig.config.state=failed`);
- gpuops's check pods (label `gpuops.io/gpu-check`, any namespace) run for a moment and
  exit 0, or exit 18 with nvidia-smi's "Driver/library version mismatch" on a node whose
  driver version the faults ConfigMap lists as check-failing; a node that advertises none
  of the resource the pod asks for fails it at admission, as the kubelet does. A `diag`
  check (its command runs `dcgmi diag -r <level> -j`) ends with DCGM 4's JSON report
  (testenv.dcgm_diag_samples) in its termination message, as its command copies it there:
  every test passing, or the test and GPU the node's `sim.gpuops.io/diag` annotation names
  failing (exit 226), or, with `hang`, no end until its deadline (DeadlineExceeded).
Every knob is a node annotation under `sim.gpuops.io/` or the faults ConfigMap, so any
process (a test, the demo) can inject a fault through the API.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import queue
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from testenv import dcgm_diag_samples as dcgm_samples
from testenv import fleet as fl

log = logging.getLogger("gpuops.testenv.simulator")

# What the MIG manager's reconfigure step pauses (its deploy labels) while it applies a layout.
_PAUSABLE = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")


@dataclass(frozen=True)
class SimulatorTiming:
    driver_ready_seconds: float = 1.0
    validator_ready_seconds: float = 0.5
    mig_apply_seconds: float = 1.0
    check_seconds: float = 0.3


# The label whose change on any node wakes the operator's upgrade controller.
UPGRADE_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def image_version(image: str) -> str:
    """`nvcr.io/nvidia/driver:580.95.05-ubuntu22.04` -> `580.95.05`."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    return tag.split("-", 1)[0]


class OperandSimulator:
    def __init__(self, api: client.ApiClient, *, namespace: str = "gpu-operator",
                 timing: SimulatorTiming = SimulatorTiming(), nudge_node: str | None = None) -> None:
        self.api = api
        # A test-speed device, not hardware: the operator's upgrade controller does not
        # watch pods and looks again only every 2 minutes, so when a driver or validator
        # pod turns Ready (or a driver pod starts crash-looping) the simulator flips the
        # upgrade skip label on this (GPU-less) node, which wakes the controller at once.
        # Benchmarks leave it off.
        self.nudge_node = nudge_node
        self._nudge_value = False
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.timing = timing
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self._pods_by_node: dict[str, set[str]] = defaultdict(set)
        self._crashloop_versions: frozenset[str] = frozenset()
        self._check_failing_versions: frozenset[str] = frozenset()
        self._no_precompiled_kernels: frozenset[str] = frozenset()
        self._check_pods: dict[str, dict[str, Any]] = {}  # uid -> gpuops check pod
        self._mig_configs: dict[str, list[dict[str, Any]]] | None = None  # until its ConfigMap is seen
        self._first_seen: dict[str, float] = {}
        self._driver_ready_at: dict[str, float] = {}
        self._mig_pending_at: dict[str, float] = {}
        self._mig_requested: dict[str, str] = {}  # node -> the mig.config last seen
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._timers: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []
        self.errors: list[str] = []

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> OperandSimulator:
        specs = [
            ("nodes", lambda **kw: self.core.list_node(**kw), self._on_node),
            ("pods", lambda **kw: self.core.list_namespaced_pod(self.namespace, **kw), self._on_pod),
            ("configmaps", lambda **kw: self.core.list_namespaced_config_map(self.namespace, **kw),
             self._on_config_map),
            ("check-pods", lambda **kw: self.core.list_pod_for_all_namespaces(
                label_selector=f"{fl.CHECK_POD_LABEL}=true", **kw), self._on_check_pod),
        ]
        for name, lister, handler in specs:
            thread = threading.Thread(target=self._watch_loop, args=(lister, handler),
                                      name=f"sim-watch-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        worker = threading.Thread(target=self._work_loop, name="sim-worker", daemon=True)
        worker.start()
        self._threads.append(worker)
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> OperandSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- watching --------------------------------------------------------------------
    def _watch_loop(self, lister, handler) -> None:
        while not self._stop.is_set():
            try:
                listed = lister(_preload_content=True)
                seen = set()
                for item in listed.items:
                    obj = self.api.sanitize_for_serialization(item)
                    seen.add(obj["metadata"]["uid"])
                    handler("ADDED", obj)
                handler("RESYNC", {"uids": seen})
                w = watch.Watch()
                self._watches.append(w)
                for event in w.stream(lister, resource_version=listed.metadata.resource_version,
                                      timeout_seconds=300, allow_watch_bookmarks=False):
                    if self._stop.is_set():
                        break
                    obj = self.api.sanitize_for_serialization(event["object"])
                    handler(event["type"], obj)
                self._watches.remove(w)
            except ApiException as err:
                if self._stop.is_set():
                    return
                if err.status != 410:
                    log.warning("simulator watch failed (%s); re-listing", err.status)
                    self._stop.wait(0.5)
            except Exception as err:  # noqa: BLE001 - a watch must survive API restarts
                if self._stop.is_set():
                    return
                log.warning("simulator watch error: %s; re-listing", err)
                self._stop.wait(0.5)

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        if kind == "RESYNC":
            return
        meta = node["metadata"]
        if meta.get("annotations", {}).get("kwok.x-k8s.io/node") != "fake":
            return
        name = meta["name"]
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(name, None)
                return
            self._nodes[name] = node
        self._queue.put(name)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "RESYNC":
            with self._lock:
                for uid in set(self._pods) - pod["uids"]:
                    self._forget_pod(uid)
            return
        if fl.operand_of(pod["metadata"].get("labels") or {}) is None:
            return
        uid = pod["metadata"]["uid"]
        node = pod["spec"].get("nodeName")
        with self._lock:
            if kind == "DELETED":
                self._forget_pod(uid)
            else:
                self._pods[uid] = pod
                if node:
                    self._pods_by_node[node].add(uid)
        if node:
            self._queue.put(node)

    def _on_check_pod(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "RESYNC":
            with self._lock:
                for uid in set(self._check_pods) - pod["uids"]:
                    self._check_pods.pop(uid, None)
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            if kind == "DELETED":
                self._check_pods.pop(uid, None)
                self._first_seen.pop(uid, None)
                return
            self._check_pods[uid] = pod
        if pod["spec"].get("nodeName"):
            self._queue.put(pod["spec"]["nodeName"])

    def _forget_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        self._first_seen.pop(uid, None)
        if pod and pod["spec"].get("nodeName"):
            self._pods_by_node[pod["spec"]["nodeName"]].discard(uid)

    def _on_config_map(self, kind: str, config_map: dict[str, Any]) -> None:
        if kind == "RESYNC":
            return
        name = config_map["metadata"]["name"]
        data = (config_map.get("data") or {}) if kind != "DELETED" else {}
        with self._lock:
            if name == fl.FAULTS_CONFIGMAP:
                self._crashloop_versions = _versions(data.get(fl.FAULT_CRASHLOOP_VERSIONS))
                self._check_failing_versions = _versions(data.get(fl.FAULT_CHECK_FAILING_VERSIONS))
                self._no_precompiled_kernels = _versions(data.get(fl.FAULT_NO_PRECOMPILED_KERNELS))
            elif name == fl.MIG_PARTED_CONFIGMAP:
                self._mig_configs = fl.mig_parted_configs(data["config.yaml"]) if "config.yaml" in data else None
            else:
                return
            nodes = list(self._nodes)
        for name in nodes:
            self._queue.put(name)

    # --- the work loop ---------------------------------------------------------------
    def _work_loop(self) -> None:
        while not self._stop.is_set():
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            try:
                name = self._queue.get(timeout=timeout)
            except queue.Empty:
                name = None
            due = set()
            while self._timers and self._timers[0][0] <= time.monotonic():
                due.add(heapq.heappop(self._timers)[1])
            if name:
                due.add(name)
            while True:  # coalesce a burst of events into one reconcile per node
                try:
                    extra = self._queue.get_nowait()
                except queue.Empty:
                    break
                if extra:
                    due.add(extra)
            for node in sorted(due):
                try:
                    self._reconcile(node)
                except ApiException as err:
                    if err.status in (404, 409):
                        self._wake(node, 0.2)
                    else:
                        self.errors.append(f"{node}: {err.status} {err.reason}")
                        log.warning("simulator could not reconcile %s: %s", node, err)
                        self._wake(node, 1.0)
                except Exception as err:  # noqa: BLE001 - keep simulating the other nodes
                    self.errors.append(f"{node}: {err!r}")
                    log.exception("simulator failed on %s", node)

    def _wake(self, node: str, after: float) -> None:
        heapq.heappush(self._timers, (time.monotonic() + after, node))

    # --- one node --------------------------------------------------------------------
    def _reconcile(self, name: str) -> None:
        with self._lock:
            node = self._nodes.get(name)
            pods = [self._pods[uid] for uid in self._pods_by_node.get(name, ()) if uid in self._pods]
            crash_versions = self._crashloop_versions
            check_failing = self._check_failing_versions
            no_image_kernels = self._no_precompiled_kernels
            mig_configs = self._mig_configs
            checks = [p for p in self._check_pods.values() if p["spec"].get("nodeName") == name]
        if node is None or node["metadata"].get("deletionTimestamp"):
            return
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        if labels.get("nvidia.com/gpu.present") != "true":
            return
        now = time.monotonic()
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        by_operand: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in live:
            by_operand[fl.operand_of(pod["metadata"]["labels"]) or ""].append(pod)

        host_driver = ann.get(fl.ANN_HOST_DRIVER)
        driver_delay = float(ann.get(fl.ANN_DRIVER_DELAY, self.timing.driver_ready_seconds))
        driver_version: str | None = None
        for pod in by_operand["driver"]:
            image = _driver_container(pod)["image"]
            version = image_version(image)
            if any(f"-{kernel}" in image.rsplit(":", 1)[-1] for kernel in no_image_kernels):
                self._set_pod(pod, _pull_failing_status(pod, image))
            elif host_driver:
                self._set_pod(pod, _crashloop_status(pod, init=True,
                                                     message="driver is pre-installed on host"))
            elif version in crash_versions:
                self._set_pod(pod, _crashloop_status(pod, init=False,
                                                     message=f"failed to load driver {version}"))
            elif now - self._first_seen.setdefault(pod["metadata"]["uid"], now) >= driver_delay:
                self._set_pod(pod, _running_status(pod))
                driver_version = version
            else:
                self._set_pod(pod, _starting_status(pod))
                self._wake(name, self._first_seen[pod["metadata"]["uid"]] + driver_delay - now)
        if driver_version is None and host_driver:
            driver_version = host_driver  # the host driver works even while the operator's crashes
        driver_ready = driver_version is not None
        if driver_ready:
            self._driver_ready_at.setdefault(name, now)
        else:
            self._driver_ready_at.pop(name, None)

        for pod in by_operand["device-plugin"]:
            self._set_pod(pod, _running_status(pod) if driver_ready else _init_status(pod))
        validator_delay = float(ann.get(fl.ANN_VALIDATOR_DELAY, self.timing.validator_ready_seconds))
        validator_fails = ann.get(fl.ANN_VALIDATOR_FAILS) == "true"
        for pod in by_operand["validator"]:
            ready_at = max(self._driver_ready_at.get(name, now), self._first_seen.setdefault(
                pod["metadata"]["uid"], now)) + validator_delay
            if driver_ready and validator_fails:
                self._set_pod(pod, _crashloop_status(pod, init=True, message="CUDA validation failed"))
            elif driver_ready and now >= ready_at:
                self._set_pod(pod, _running_status(pod))
            else:
                self._set_pod(pod, _init_status(pod))
                if driver_ready:
                    self._wake(name, ready_at - now)

        new_labels: dict[str, str | None] = {}
        new_ann: dict[str, str | None] = {}
        if driver_version and labels.get("nvidia.com/cuda.driver-version.full") != driver_version:
            new_labels.update(fl.driver_version_labels(driver_version))
        if driver_version and fl.ANN_GFD in ann:
            # GFD publishes what it finds where the label is missing (a value a person set
            # stays: on host-driver nodes GFD is often off, which is why people set them).
            new_labels.update({k: v for k, v in json.loads(ann[fl.ANN_GFD]).items() if k not in labels})

        mig_paused = self._reconcile_mig(name, labels, ann, now, new_labels, new_ann, mig_configs)
        plugin_ready = any(_is_ready(p) for p in by_operand["device-plugin"])
        allocatable = self._advertise(node, ready=driver_ready and plugin_ready and not mig_paused,
                                      mig_config=ann.get(fl.ANN_MIG_APPLIED), mig_configs=mig_configs)
        self._not_ready(node, ann)
        self._run_checks(name, checks, now, allocatable=allocatable, driver_version=driver_version,
                         check_failing=check_failing, diag=ann.get(fl.ANN_DIAG, ""))
        if new_labels or new_ann:
            self.core.patch_node(name, {"metadata": {"labels": new_labels, "annotations": new_ann}})

    def _end_diag(self, name: str, pod: dict[str, Any], level: int, *, gpus: int, started: float, now: float,
                  diag: str) -> None:
        """A diag check's end: DCGM's report, as the node's `sim.gpuops.io/diag` says."""
        if diag == "hang":
            deadline = float(pod["spec"].get("activeDeadlineSeconds") or 0)
            if now - started < deadline:
                self._wake(name, started + deadline - now)
                return
            status = _base(pod, "Failed")
            status["reason"], status["message"] = ("DeadlineExceeded",
                                                   "Pod was active on the node longer than the specified deadline")
            self._set_pod(pod, status)
            return
        failing: dict[int, str] = {}
        if diag not in ("", "pass") and ":" in diag:
            test, _, gpu = diag.partition(":")
            failing[int(gpu)] = test
        report = dcgm_samples.dcgm4_compact(gpus=gpus, level=level, failing=failing)
        self._set_pod(pod, _exited_status(pod, 226 if failing else 0, report[:4096]))

    def _run_checks(self, name: str, checks: list[dict[str, Any]], now: float, *, allocatable: dict[str, str],
                    driver_version: str | None, check_failing: frozenset[str], diag: str = "") -> None:
        """gpuops's check pods on the node: a moment "running", then an exit."""
        for pod in checks:
            if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                    "Succeeded", "Failed"):
                continue
            container = pod["spec"]["containers"][0]
            wanted = next(iter(((container.get("resources") or {}).get("limits") or {}).items()), None)
            if wanted is not None and int(allocatable.get(wanted[0], "0")) < int(wanted[1]):
                # The device plugin has none to give: the kubelet's admission fails the pod.
                self._set_pod(pod, _refused_status(pod, wanted[0], int(wanted[1]),
                                                   int(allocatable.get(wanted[0], "0"))))
                continue
            started = self._first_seen.setdefault(pod["metadata"]["uid"], now)
            level = _diag_level(container)
            if now - started < self.timing.check_seconds:
                self._set_pod(pod, _starting_status(pod))
                self._wake(name, started + self.timing.check_seconds - now)
            elif level is not None:
                self._end_diag(name, pod, level, gpus=int(wanted[1]) if wanted else 1, started=started, now=now,
                               diag=diag)
            elif driver_version is not None and driver_version in check_failing:
                self._set_pod(pod, _exited_status(pod, 18, "Failed to initialize NVML: Driver/library version "
                                                           f"mismatch\nNVML library version: {driver_version}"))
            else:
                self._set_pod(pod, _exited_status(pod, 0, None))

    def _reconcile_mig(self, name: str, labels: dict[str, str], ann: dict[str, str], now: float,
                       new_labels: dict[str, str | None], new_ann: dict[str, str | None],
                       configs: dict[str, list[dict[str, Any]]] | None) -> bool:
        """Plays the MIG manager. Returns whether the node's operands are paused for a MIG
        change. Waits for the mig-parted ConfigMap (the operator makes it)."""
        desired = labels.get("nvidia.com/mig.config")
        if labels.get("nvidia.com/mig.capable") != "true" or desired is None or configs is None:
            return False
        applied = ann.get(fl.ANN_MIG_APPLIED)
        state = labels.get("nvidia.com/mig.config.state")
        # The MIG manager acts on a change of the label; a state it did not write (or its
        # own failure) stays until then.
        requested = self._mig_requested.get(name, desired) != desired
        self._mig_requested[name] = desired
        if applied is None or (applied == desired and state is None):  # the layout it came up with
            return not self._apply_mig(name, _hardware(labels, ann), desired, configs, new_labels, new_ann)
        if applied == desired:  # nothing to change (or a change was taken back)
            if state == "pending" or (state == "failed" and requested):
                new_labels["nvidia.com/mig.config.state"] = "success"
            self._unpause(labels, new_labels)
            self._mig_pending_at.pop(name, None)
            return False
        if state == "failed" and not requested and name not in self._mig_pending_at:
            return False  # mig-parted gave up on this layout; a new request starts again
        if state != "pending" and name not in self._mig_pending_at:
            self._mig_pending_at[name] = now
            new_labels["nvidia.com/mig.config.state"] = "pending"
            new_ann["gpuops.io/mig-state-since"] = _now_iso()
            for operand in _PAUSABLE:
                if labels.get(f"nvidia.com/gpu.deploy.{operand}") == "true":
                    new_labels[f"nvidia.com/gpu.deploy.{operand}"] = "paused-for-mig-change"
        started = self._mig_pending_at.setdefault(name, now)
        if ann.get(fl.ANN_MIG_STUCK) == "true":
            return True
        if now - started < self.timing.mig_apply_seconds:
            self._wake(name, started + self.timing.mig_apply_seconds - now)
            return True
        self._mig_pending_at.pop(name, None)
        self._unpause(labels, new_labels)
        if ann.get(fl.ANN_MIG_FAILS) == "true":
            new_labels["nvidia.com/mig.config.state"] = "failed"
            return False
        self._apply_mig(name, _hardware(labels, ann), desired, configs, new_labels, new_ann)
        return False  # applied, or failed with the old layout still in place

    def _apply_mig(self, name: str, labels: dict[str, str], layout: str, configs: dict[str, list[dict[str, Any]]],
                   new_labels: dict[str, str | None], new_ann: dict[str, str | None]) -> bool:
        """mig-parted applies `layout` to the node's GPUs: success with GFD's per-profile
        counts (old profiles removed, as the node has them now: the cached copy can lag
        this simulator's own last patch), or failed when the layout does not fit the GPUs."""
        try:
            devices = fl.mig_devices(layout, product=labels.get("nvidia.com/gpu.product", ""),
                                     gpus=int(labels.get("nvidia.com/gpu.count", "0")), configs=configs)
        except fl.MigLayoutError as err:
            log.info("MIG manager: %s", err)
            new_labels["nvidia.com/mig.config.state"] = "failed"
            return False
        now_labels = self.core.read_node(name).metadata.labels or {}
        new_labels.update({key: None for key in (*labels, *now_labels)
                           if key.startswith("nvidia.com/mig-") and key.endswith(".count")})
        new_labels.update({f"nvidia.com/mig-{profile}.count": str(n) for profile, n in devices.items()})
        new_labels["nvidia.com/mig.config.state"] = "success"
        new_ann[fl.ANN_MIG_APPLIED] = layout
        return True

    @staticmethod
    def _unpause(labels: dict[str, str], new_labels: dict[str, str | None]) -> None:
        for operand in _PAUSABLE:
            if labels.get(f"nvidia.com/gpu.deploy.{operand}") == "paused-for-mig-change":
                new_labels[f"nvidia.com/gpu.deploy.{operand}"] = "true"

    def _advertise(self, node: dict[str, Any], *, ready: bool, mig_config: str | None,
                   mig_configs: dict[str, list[dict[str, Any]]] | None) -> dict[str, str]:
        """Set what the node advertises; returns its allocatable GPU resources now."""
        labels = node["metadata"].get("labels") or {}
        ann = node["metadata"].get("annotations") or {}
        status = node.get("status") or {}
        capacity = status.get("capacity") or {}
        labels = _hardware(labels, ann)
        gpus = int(labels.get("nvidia.com/gpu.count", "0"))
        override = ann.get(fl.ANN_ADVERTISE)
        product = labels.get("nvidia.com/gpu.product", "")
        pool = fl.PoolSpec(name="-", nodes=0, gpus_per_node=gpus, product=product.removesuffix("-SHARED"),
                           replicas=int(labels.get("nvidia.com/gpu.replicas", "1")),
                           rename_shared=labels.get("nvidia.com/gpu.product", "").endswith("-SHARED"))
        strategy = labels.get("nvidia.com/mig.strategy", "none")
        mig_capable = labels.get("nvidia.com/mig.capable") == "true"
        if mig_capable and labels.get("nvidia.com/mig.config") and (mig_config is None or mig_configs is None):
            ready = False  # the MIG manager has not applied a layout (or has no mig-parted config) yet
        full = fl.advertised_resources(
            pool, mig_config=mig_config if mig_capable else None, strategy=strategy,
            gpus=int(override) if override is not None else None, configs=mig_configs)
        current = {k: v for k, v in capacity.items() if k.startswith("nvidia.com/")}
        if ready:
            desired: dict[str, str | None] = dict(full)
        else:
            desired = {k: "0" for k in (set(current) | set(full))}
        for key in current:
            if key not in desired:
                desired[key] = None
        # Devices the device plugin's health check marked unhealthy leave allocatable.
        unhealthy = int(ann.get(fl.ANN_UNHEALTHY, "0"))
        allocatable = {k: (str(max(0, int(v) - unhealthy)) if v is not None else None) for k, v in desired.items()}
        current_allocatable = (status.get("allocatable") or {})
        now_allocatable = {k: v for k, v in allocatable.items() if v is not None}
        if all(current.get(k) == v for k, v in desired.items()) and \
                all(current_allocatable.get(k) == v for k, v in allocatable.items()):
            return now_allocatable
        self.core.patch_node_status(node["metadata"]["name"],
                                    {"status": {"capacity": desired, "allocatable": allocatable}})
        return now_allocatable

    def _not_ready(self, node: dict[str, Any], ann: dict[str, str]) -> None:
        if ann.get(fl.ANN_NOT_READY) != "true":
            return
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c["type"] == "Ready"), None)
        if ready and ready["status"] == "False":
            return
        now = _now_iso()
        self.core.patch_node_status(node["metadata"]["name"], {"status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "simulated: container runtime is down", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}})

    def _set_pod(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        current = pod.get("status") or {}
        if (current.get("phase"), _is_ready(pod), _waiting(current)) == (
            status["phase"], _ready_in(status), _waiting(status)
        ):
            return
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
            # Ready, or crash-looping past the upgrade controller's restart limit: both
            # are what its next look acts on (upgrade-done, upgrade-failed).
            turned = _ready_in(status) or "CrashLoopBackOff" in _waiting(status)
            if self.nudge_node and turned and fl.operand_of(meta.get("labels") or {}) in ("driver", "validator"):
                self._nudge()

    def _nudge(self) -> None:
        self._nudge_value = not self._nudge_value
        self.core.patch_node(self.nudge_node, {"metadata": {"labels": {
            UPGRADE_SKIP_LABEL: "false" if self._nudge_value else None}}})


# --- pod statuses ---------------------------------------------------------------------------

def _driver_container(pod: dict[str, Any]) -> dict[str, Any]:
    """The driver container of a driver pod (the operator's also runs side containers)."""
    containers = pod["spec"]["containers"]
    return next((c for c in containers if c["name"] == "nvidia-driver-ctr"), containers[0])


def _is_ready(pod: dict[str, Any]) -> bool:
    return _ready_in(pod.get("status") or {})


def _ready_in(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _waiting(status: dict[str, Any]) -> tuple[str, ...]:
    reasons = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            reasons.append(((cs.get("state") or {}).get("waiting") or {}).get("reason") or "")
    return tuple(reasons)


def _conditions(*, ready: bool, initialized: bool = True) -> list[dict[str, str]]:
    now = _now_iso()
    value = "True" if ready else "False"
    return [
        {"type": "Initialized", "status": "True" if initialized else "False", "lastTransitionTime": now},
        {"type": "Ready", "status": value, "lastTransitionTime": now},
        {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
    ]


def _container(spec: dict[str, Any], *, state: dict[str, Any], ready: bool, restarts: int = 0,
               last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": spec["name"], "image": spec["image"], "imageID": "", "ready": ready,
              "restartCount": restarts, "started": "running" in state, "state": state}
    if last:
        status["lastState"] = last
    return status


def _base(pod: dict[str, Any], phase: str) -> dict[str, Any]:
    return {"phase": phase, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or _now_iso()}


def _init_containers_done(pod: dict[str, Any], now: str) -> list[dict[str, Any]]:
    return [_container(c, state={"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now,
                                                "startedAt": now}}, ready=True)
            for c in pod["spec"].get("initContainers") or []]


def _running_status(pod: dict[str, Any]) -> dict[str, Any]:
    now = _now_iso()
    status = _base(pod, "Running")
    status["conditions"] = _conditions(ready=True)
    status["initContainerStatuses"] = _init_containers_done(pod, now)
    status["containerStatuses"] = [
        _container(c, state={"running": {"startedAt": now}}, ready=True) for c in pod["spec"]["containers"]]
    return status


def _starting_status(pod: dict[str, Any]) -> dict[str, Any]:
    status = _base(pod, "Pending")
    status["conditions"] = _conditions(ready=False, initialized=False)
    status["containerStatuses"] = [
        _container(c, state={"waiting": {"reason": "ContainerCreating"}}, ready=False)
        for c in pod["spec"]["containers"]]
    return status


def _hardware(labels: dict[str, str], ann: dict[str, str]) -> dict[str, str]:
    """The node's labels with GFD's view of its hardware over them: what a person set by
    hand does not change the GPUs it has."""
    return {**labels, **json.loads(ann[fl.ANN_GFD])} if fl.ANN_GFD in ann else labels


def _init_status(pod: dict[str, Any]) -> dict[str, Any]:
    """Waiting in an init container for the driver, as the device plugin and validator do."""
    status = _base(pod, "Pending")
    status["conditions"] = _conditions(ready=False, initialized=False)
    status["containerStatuses"] = [
        _container(c, state={"waiting": {"reason": "PodInitializing"}}, ready=False)
        for c in pod["spec"]["containers"]]
    return status


def _exited_status(pod: dict[str, Any], code: int, message: str | None) -> dict[str, Any]:
    now = _now_iso()
    ended: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                             "startedAt": now, "finishedAt": now}
    if message:
        ended["message"] = message
    status = _base(pod, "Succeeded" if code == 0 else "Failed")
    status["conditions"] = _conditions(ready=False)
    status["containerStatuses"] = [_container(c, state={"terminated": ended}, ready=False)
                                   for c in pod["spec"]["containers"]]
    return status


def _refused_status(pod: dict[str, Any], resource: str, wanted: int, available: int) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "UnexpectedAdmissionError",
            "message": (f"Allocate failed due to requested number of devices unavailable for {resource}. "
                        f"Requested: {wanted}, Available: {available}, which is unexpected"),
            "startTime": _now_iso()}


def _diag_level(container: dict[str, Any]) -> int | None:
    """The level of the `dcgmi diag -r <level>` a check pod's command runs (None: no diag)."""
    found = re.search(r"dcgmi diag -r ([0-9]+)", " ".join(container.get("command") or ()))
    return int(found.group(1)) if found else None


def _versions(listed: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (listed or "").split(",") if v.strip())


def _pull_failing_status(pod: dict[str, Any], image: str) -> dict[str, Any]:
    """The driver manager ran; the driver's own image is not in the registry."""
    now = _now_iso()
    status = _base(pod, "Pending")
    status["conditions"] = _conditions(ready=False)
    status["initContainerStatuses"] = _init_containers_done(pod, now)
    status["containerStatuses"] = [
        _container(c, state={"waiting": {"reason": "ImagePullBackOff",
                                         "message": f'Back-off pulling image "{image}"'}}, ready=False)
        for c in pod["spec"]["containers"]]
    return status


def _crashloop_status(pod: dict[str, Any], *, init: bool, message: str) -> dict[str, Any]:
    now = _now_iso()
    crashed = {"waiting": {"reason": "CrashLoopBackOff",
                           "message": f"back-off 5m0s restarting failed container: {message}"}}
    last = {"terminated": {"exitCode": 1, "reason": "Error", "message": message,
                           "startedAt": now, "finishedAt": now}}
    status = _base(pod, "Pending" if init else "Running")
    status["conditions"] = _conditions(ready=False, initialized=not init)
    if init:
        status["initContainerStatuses"] = [
            _container(c, state=crashed, ready=False, restarts=12, last=last)
            for c in pod["spec"].get("initContainers") or []]
        status["containerStatuses"] = [
            _container(c, state={"waiting": {"reason": "PodInitializing"}}, ready=False)
            for c in pod["spec"]["containers"]]
    else:
        status["containerStatuses"] = [
            _container(c, state=crashed, ready=False, restarts=12, last=last) for c in pod["spec"]["containers"]]
    return status
