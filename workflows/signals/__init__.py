"""GPU health from DCGM (the dcgm-exporter's series, read through Prometheus or straight
from an exporter's page): per node and GPU, the last XID with its meaning (`xids`),
temperatures, clock-throttle reasons, ECC, row remapping and PCIe replays (`health`);
the findings those raise against configured thresholds (`findings`), their sentences
(`messages`), and the service that reads the series when a command asks (`service`).
A series that is absent is "not reported", never healthy. Pure apart from `service`,
which reads only through `workflows.prometheus`. Imports `fleet` (the Finding type),
`kube` (names), `prometheus` and the bottom modules."""
