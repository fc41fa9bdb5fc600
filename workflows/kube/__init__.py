"""The only door to the Kubernetes API: the gateway (a package: its client owns the one
request function with retries, backoff and Retry-After; reading, watching, writing and
decoding beside it), the wire schemas lists and watches decode into, the frozen object
views everything above works on, the typed errors, and the names of labels and
annotations the GPU Operator, GFD and gpuops put on objects. Imports nothing else of
gpuops; only `gateway.client` imports the kubernetes client."""
