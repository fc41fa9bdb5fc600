"""What the GPU fleet looks like: each node assessed, findings that need a person, the
per-pool summary, and the watch-backed cache that keeps it current. Imports `kube` and the
bottom modules; never the clock (time is an argument).

A node's assessment asks one question per module: the pods on it (`pods`: operand pods,
GPU pods), the operator's settings that reach it (`operator_settings`), a driver upgrade
or MIG change under way (`node_changes`), who owns its driver with the evidence
(`driver_owner`); `assessment` assembles the node as a whole (`/gpu node`), `pool` is one
pool at a glance, `settings` how gpuops reads the fleet. `node_detail` is what `/gpu node`
reads from the API when asked (who set the node's labels and taints, the budgets of its GPU
pods), within one deadline; `messages` its sentences."""
