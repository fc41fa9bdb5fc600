"""Pool policy: the configured `PoolConfig`, maintenance windows, `max_unavailable`,
`min_ready_gpus` and the capacity checks that apply them to a drain or a wave, label
selectors, and the sentences that explain a refusal. Imports `fleet`, `plans`, `kube` and
the bottom modules."""
