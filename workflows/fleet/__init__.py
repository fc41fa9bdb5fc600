"""What the GPU fleet looks like: each node assessed (driver owner with its evidence,
advertised vs physical GPUs, operand pods, upgrade and MIG state), findings that need a
person, the per-pool summary, and the watch-backed cache that keeps it current. Imports
`kube` and the bottom modules; never the clock (time is an argument)."""
