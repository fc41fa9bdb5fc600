"""The only door to the Kubernetes API: the gateway (one request function owning retries,
backoff and Retry-After), the wire schemas lists and watches decode into, the frozen
object views everything above works on, the typed errors, and the names of labels and
annotations the GPU Operator, GFD and gpuops put on objects. Imports nothing else of
gpuops; only `gateway` (and the watch cache in `fleet`) imports the kubernetes client."""
