"""Pre-flight: what a plan says will fail before two people approve it, for every kind
of change. Each check reads the fleet as the watch cache has it and the pool's policy, and
answers with values the plan's summary carries (so they are part of the hash an approver
approves) and sentences in this package's messages: nodes with an open finding the change
would not fix (left out unless the request names them), budgets that allow no disruption
for the GPU pods a run would move, a canary whose resource the pool will not advertise,
how long the run will take against its window, and what else the change touches. Imports
`pools`, `signals`, `fleet`, `plans`, `kube`, the bottom modules and `storage`."""
