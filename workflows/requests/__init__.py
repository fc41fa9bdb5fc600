"""Requests for a change (drain, upgrade, MIG change) bound to their plan's hash: the
request service, the two-person rule and every refusal it gives (`policy`), and their
sentences. Imports `pools`, `plans`, `kube` and the bottom modules; storage records the
decisions, this package makes them."""
