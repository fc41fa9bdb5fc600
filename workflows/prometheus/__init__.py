"""The only door to Prometheus and to exporters' `/metrics` pages: HTTP GETs read whole
within one deadline and a size cap (`fetching`) with the configured authentication,
answers turned into plain `Sample` values (a series of an odd shape carries its problem),
failures into one small typed tree (`PrometheusUnavailable` and its kinds). Nothing above
it builds a URL. Imports nothing from workflows/ (a bottom layer, beside `kube`)."""
