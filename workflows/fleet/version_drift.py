"""The finding for a driver version that drifted from its owner: the ClusterPolicy or
NVIDIADriver setting a pool's driver names another version than the GitOps tool or Helm
release keeping it last applied, or someone other than that owner wrote the field. The
owner's next sync puts its own value back, so the version the pool is heading for is not
the one the object shows (`fleet.version_owner` judges it)."""

from __future__ import annotations

from workflows.fleet.findings import Finding, pool_command
from workflows.fleet.pool import PoolInventory
from workflows.fleet.version_owner import VersionOwner


def version_drift_findings(pool: PoolInventory) -> tuple[Finding, ...]:
    """One finding per object setting the pool's driver whose version drifted from its
    owner: a warning where Git's tool puts its version back within minutes, information
    where a Helm release does so only at its next upgrade (a team may patch on purpose)."""
    return tuple(
        Finding(severity="warning" if owner.from_git else "info", code="driver-version-drift", subject=pool.name, pool=pool.name,
                message=msg_driver_version_drift(owner), command=pool_command(pool.name))
        for manager in pool.driver_managers
        if (owner := manager.version_owner) is not None and owner.tool is not None and owner.drifted
    )


def msg_driver_version_drift(owner: VersionOwner) -> str:
    live = owner.live or "no version"
    if owner.changed_by:
        what = (f"{owner.field} was changed to {live} by {', '.join(owner.changed_by)}, not by "
                f"{owner.tool} {owner.source or ''}".rstrip())
    else:
        what = f"{owner.field} is {live}, but {owner.tool} last applied {owner.last_applied}"
    back = "the next sync puts back what Git names" if owner.from_git else "the next apply of the release puts its version back"
    return f"{owner.object}: {what}; {back}: change the version in the owner, not on the object"
