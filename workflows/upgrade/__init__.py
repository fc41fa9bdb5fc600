"""Per-pool driver upgrades. Built so far: the scope of an upgrade (`scope`): which object
sets the pool's driver version and which pools it reaches, the version asked for, and
every refusal the request makes before a plan; the canary and its waves. Not built yet
(issue 17 goes on): the upgrade request and its form, the run (the version patch, the
per-node steps the engine already has, gating the operator's own upgrade), rollback and
progress. The step kinds only upgrades use and the engine logic that runs them:
`step_logic`. Imports what lies below drain (engine, requests, pools, fleet, plans, kube)."""
