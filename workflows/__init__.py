"""The cluster domain: plain views of Kubernetes objects, the fleet inventory and its
findings, pool policy, plans, the durable engine and its steps. `kube` (with the watch
cache beside it) is the only module that imports the kubernetes client."""
