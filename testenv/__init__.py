"""A local control plane with a simulated GPU fleet, for tests, the demo and
benchmarks: binaries built from the Go module proxy (build), the control plane
(controlplane, pki), fleets and the GPU Operator's objects (fleet, install), the
operand simulator (simulator) and the fake Slack (fakeslack). Never imported by the
product packages."""
