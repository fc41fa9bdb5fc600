"""Per-pool driver upgrades: the scope of an upgrade (`scope`): which object sets the
pool's driver version and which pools it reaches, the version asked for, and every
refusal the request makes before a plan; the plan with its canary and waves, and the
steps each node goes through (`plan`); the request, preview and rollback (`service`),
and their sentences (`messages`); the step kinds only upgrades use and the engine logic
that runs them (`step_logic`). The run itself (the version patch, the per-node steps,
gating the operator's own upgrade) is the engine's. Imports what lies below drain
(engine, requests, pools, fleet, plans, kube)."""
