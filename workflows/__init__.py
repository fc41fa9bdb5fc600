"""The cluster domain, one package per domain word, layered (each may import only what
is below it; `tests/unit/test_layers.py` checks it with import-linter):

    config                       the configuration file, over all
    handover                     the shift-handover checklist and its service
    quotas                       GPU ResourceQuotas against the pools they can draw on
    drain                        drain requests planned into waves; drain history
    engine                       runs, steps as gates, the engine loop, the Lease
    requests                     requests, the two-person rule, refusals
    pools | signals              windows, capacity floors, max unavailable, selectors;
                                 GPU health from DCGM (XIDs, temperatures, ECC, ...)
    fleet                        node assessment, findings, the fleet summary, watch cache
    plans                        a plan of waves and steps, and its hash
    kube | prometheus            the only door to the Kubernetes API; the only door
                                 to Prometheus and exporters' /metrics
    access | durations | wording who may do what; "1h30m"; shared phrasing;
      | logfields | kinds        the ids a log line is about; the kinds of change
                                 (drain, upgrade, mig, migrate), each described once

Upgrades, MIG changes and host-driver migration land beside `drain` as packages of
their own."""
