"""The only door to Prometheus and to exporters' `/metrics` pages: HTTP GETs with a
timeout and the configured authentication, answers turned into plain `Sample` values,
failures into one small typed tree (`PrometheusUnavailable` and its kinds). Nothing above
it builds a URL. Imports nothing from workflows/ (a bottom layer, beside `kube`)."""
