"""A node mid-change by the operator: its driver upgrade state (the upgrade controller's
label) and its MIG change state (the MIG manager's), each with when it began, so findings
can tell a change in progress from one stuck. Holds timestamps, never ages: `now` is an
argument."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal, TypeAlias

from workflows.fleet.loose_values import parse_time, parse_unix
from workflows.kube.labels import (
    ANNOTATION_MIG_STATE_SINCE,
    ANNOTATION_UPGRADE_HELD_BY,
    ANNOTATION_UPGRADE_STATE_SINCE,
    ANNOTATION_VALIDATION_START,
    ANNOTATION_WAIT_FOR_JOBS_START,
    LABEL_MIG_CAPABLE,
    LABEL_MIG_CONFIG,
    LABEL_MIG_CONFIG_STATE,
    LABEL_UPGRADE_SKIP,
    LABEL_UPGRADE_STATE,
)
from workflows.kube.objects import NodeObject


# Values of nvidia.com/gpu-driver-upgrade-state, in the controller's order. The label is
# read as a plain string because a newer operator may add states.
UpgradeState: TypeAlias = Literal[
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
]
UPGRADE_DONE: UpgradeState = "upgrade-done"
UPGRADE_FAILED: UpgradeState = "upgrade-failed"
# Values of nvidia.com/mig.config.state (read as a plain string for the same reason).
MigConfigState: TypeAlias = Literal["pending", "rebooting", "success", "failed"]
MIG_STATES_IN_PROGRESS: frozenset[str] = frozenset({"pending", "rebooting"})
MIG_STATE_FAILED: MigConfigState = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class UpgradeStatus:
    state: str | None  # nvidia.com/gpu-driver-upgrade-state; None when not labelled
    since: dt.datetime | None  # when the node entered it, when known
    # nvidia.com/gpu-driver-upgrade.skip=true: the upgrade controller leaves the node alone.
    skip: bool = False
    # The gpuops run that set that label to gate the operator (None: a person set it).
    held_by: str | None = None

    @property
    def in_progress(self) -> bool:
        return self.state is not None and self.state != UPGRADE_DONE

    @property
    def failed(self) -> bool:
        return self.state == UPGRADE_FAILED

    def age(self, now: dt.datetime) -> dt.timedelta | None:
        return None if self.since is None else now - self.since


@dataclass(frozen=True, slots=True, kw_only=True)
class MigStatus:
    capable: bool
    strategy: str | None  # none | single | mixed
    config: str | None  # the requested profile, nvidia.com/mig.config
    config_state: str | None  # pending | rebooting | success | failed
    since: dt.datetime | None  # when config_state was entered, when known

    @property
    def in_progress(self) -> bool:
        return self.config_state in MIG_STATES_IN_PROGRESS

    @property
    def enabled(self) -> bool:
        """A MIG profile is asked for (a config other than all-disabled)."""
        return bool(self.config) and not str(self.config).startswith("all-disabled")

    @property
    def failed(self) -> bool:
        return self.config_state == MIG_STATE_FAILED

    def age(self, now: dt.datetime) -> dt.timedelta | None:
        return None if self.since is None else now - self.since


def upgrade_status(node: NodeObject) -> UpgradeStatus:
    labels = node.labels
    state = labels.get(LABEL_UPGRADE_STATE) or None
    return UpgradeStatus(state=state, since=_upgrade_since(node, state),
                         skip=labels.get(LABEL_UPGRADE_SKIP) == "true",
                         held_by=node.annotations.get(ANNOTATION_UPGRADE_HELD_BY) or None)


def mig_status(node: NodeObject, *, strategy: str | None) -> MigStatus:
    """`strategy` is the node's own MIG strategy label, else the ClusterPolicy's."""
    labels = node.labels
    return MigStatus(
        capable=labels.get(LABEL_MIG_CAPABLE) == "true",
        strategy=strategy,
        config=labels.get(LABEL_MIG_CONFIG),
        config_state=labels.get(LABEL_MIG_CONFIG_STATE),
        since=parse_time(node.annotations.get(ANNOTATION_MIG_STATE_SINCE)),
    )


def _upgrade_since(node: NodeObject, state: str | None) -> dt.datetime | None:
    if state is None:
        return None
    recorded = parse_time(node.annotations.get(ANNOTATION_UPGRADE_STATE_SINCE))
    if recorded is not None:
        return recorded
    # Without gpuops' record, the controller's own start times cover the two states in
    # which nodes are known to hang (waiting for jobs, validation).
    if state == "wait-for-jobs-required":
        return parse_unix(node.annotations.get(ANNOTATION_WAIT_FOR_JOBS_START))
    if state == "validation-required":
        return parse_unix(node.annotations.get(ANNOTATION_VALIDATION_START))
    return None
