"""The durable engine: runs of approved plans, steps as idempotent gates (cordon, evict,
hold, wait, validate, driver, driver version, operator hold and upgrade, the canary pod
(`check_pod`), MIG, uncordon), the loop that drives them wave by wave on
the replica holding the Lease, `/gpu uncordon` for what a finished run left behind, the
Kubernetes Events its audited actions make (`kube_events`, sent by the Lease holder), and
their sentences. Imports `requests`, `pools`, `fleet`, `plans`, `kube` and the bottom
modules; it knows no particular kind of request."""
