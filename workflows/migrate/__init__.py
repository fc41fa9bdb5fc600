"""Moving a pool's nodes from host-installed drivers to the GPU Operator, node by node,
with one-step rollback: the plan (`plan`: each node's driver owner with its evidence,
the labels that change, the one step that needs a person) and the request and rollback
(`service`). Runs on the same engine, approvals, windows and steps as drains, upgrades
and MIG changes. The step kinds only it uses and the engine logic
that runs them: `step_logic`."""
