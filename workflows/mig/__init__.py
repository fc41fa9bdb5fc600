"""MIG layout changes as approved capacity changes: the MIG manager's layouts read from its
mig-parted config (`layouts`, with what gpuops knows of GPU models in `hardware`), the
plan of a pool's change (`plan`: per node and pool, resources before and after, the
capacity floor in the new units, evictions and the workloads left without their
resource), and the request and rollback (`service`). Runs on the same engine, approvals,
windows and steps as drains and upgrades. The step kinds only it uses and the engine logic
that runs them: `step_logic`."""
