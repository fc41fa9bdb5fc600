"""Drain windows: a drain request checked against its pool and cut into waves
(`plan`), the drain history `/gpu status` and the handover show (`history`), and their
sentences. The `/gpu drain` grammar lives in commands/. Imports everything below it
(engine, requests, pools, fleet, plans, kube)."""
