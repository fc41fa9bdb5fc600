"""What each kind of step does to one node, as gates and actions that are safe to repeat.

The engine (`workflows.engine.loop`) runs a step in two calls, with a durable transition
before each side effect:

1. `prepare(ctx)` reads the cluster and returns the step's *intent* (what it found and
   what it is about to do: the node's prior schedulability, the pods it will evict, the
   driver pod it will delete). No side effects. The engine stores the intent with the
   step's move to `running`, in the same transaction as its audit row and outbox message.
2. `advance(ctx)` is called after that commit, again on every watch event about the node,
   on the step's timer, and after a restart. It observes the cluster first and acts only
   when the effect is not there yet (idempotency by observation: a node that already
   carries this run's cordon mark is cordoned; a driver pod whose recorded uid is gone was
   deleted), then answers `Done`, `Waiting` or `Failed`.

Side effects go through `ctx.act()` first, which refuses (raises `LeaseLost`) when this
replica does not hold the engine lease, and an action that must be on record before it
happens for each of several objects (one eviction per pod) goes through `ctx.record()`,
which commits an audit row once per intent key.

Reads that decide an action come fresh from the API (`ctx.gateway`), never from the
watch cache, which may lag behind the engine's own last write. Waiting for a condition
reads the watch cache (`ctx.node_inventory()`), and the engine calls `advance` again on
every change the cache reports.

Gates fail closed: an API error is never read as "nothing to do"; a step the API refuses
for lack of permission or a bad request fails at once, with the API's words.

What belongs here: one module per family of steps, each a few gates and actions on one
node, and the table of which logic runs which step kind.

- `contract`: what every step is given (`StepContext`) and answers (`Done`, `Waiting`,
  `StepNotice`, `LeftOut`, `Failed`), the `StepLogic` protocol, `StepParamsError` and
  `params_of`. A step's params are a typed record (`storage.step_params`): each logic
  names its record (`params`), the engine decodes the stored row with it, and a family
  that has step kinds of its own declares their records beside its logic.
- `cordoning`: `Cordon`, `Uncordon` and the cordon mark they leave on a node.
- `eviction`: which pods an eviction takes (`decide`, `gpu_use`), `Evict`, and the gate
  that keeps a driver or MIG change off a node GPU pods still run on.
- `waiting`: `WaitFor` and `validate` (the node checks), `WaitForJobs`, `Hold`.
- `driver`: restarting the operator's driver pod (`Driver`), the version on the
  ClusterPolicy or NVIDIADriver (`SetDriverVersion`) and who keeps that object in Git.
- `operator_upgrade`: holding nodes back from the GPU Operator's own upgrade and
  following it (`OperatorHold`, `OperatorUpgrade`).
- `mig`: a MIG layout (`Mig`).
- `gpu_check`: the canary pod (`RunGpuCheck`; the pod itself is `workflows.engine.check_pod`).
- `host_driver`: moving a node off a host driver: `Snapshot`, `HostDriverByHand`,
  `SetNodeLabels`, `Restore`.
- `table`: which logic runs each step kind (`logic_for`): the engine's own for the step
  kinds every kind of change shares, and for the rest the logic a kind's registry line
  gives (`ChangeKind.step_logic`: `workflows/<kind>/step_logic.py` maps its own step
  kinds to the classes here, or to its own).
"""
