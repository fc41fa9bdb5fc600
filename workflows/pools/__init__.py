"""Pool policy: the configured `PoolConfig`, maintenance windows, `max_unavailable`,
`min_ready_gpus` and the capacity checks that apply them to a drain or a wave, label
selectors, change freezes of a pool or the cluster (`freezes`: stored, audited, read by
the request service and the engine), the shape every plan of a pool's nodes takes
(`planning`: targets -> policy -> window -> rolling order -> waves, each kind supplying
its targets, steps, refusals and notes), and the sentences that explain a refusal. Imports
`fleet`, `plans`, `kube`, the bottom modules and `storage`."""
