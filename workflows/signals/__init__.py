"""GPU health from DCGM (the dcgm-exporter's series, read through Prometheus or straight
from the exporter pods' pages): per node and GPU, the last XID with its meaning (`xids`),
temperatures, clock-throttle reasons, ECC, row remapping and PCIe replays (`health`);
how fast the counters grow between two readings of an exporter (`rates`); one reading,
with why a node's health is unknown (`reading`); the findings those raise against
configured thresholds (`findings`), their sentences (`messages`), and the readers that ask
when a command does: through Prometheus (`service`) or each node's exporter pod, found in
the cluster snapshot by its pod IP (`exporters`). A series that is absent is "not
reported", never healthy; an exporter that does not answer leaves its node unknown. Pure
apart from `service` and `exporters`, which read only through `workflows.prometheus`.
Imports `fleet` (the Finding type, what a GPU node is), `kube` (names, pod views),
`prometheus` and the bottom modules."""
