{{- define "gpuops.labels" -}}
app.kubernetes.io/name: gpuops
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpuops.selector" -}}
app.kubernetes.io/name: gpuops
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuops.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end -}}

{{- define "gpuops.secretName" -}}
{{ default (printf "%s-slack" .Release.Name) .Values.slack.existingSecret }}
{{- end -}}

{{- define "gpuops.configMapName" -}}
{{ default (printf "%s-config" .Release.Name) .Values.existingConfigMap }}
{{- end -}}

{{- define "gpuops.subject" -}}
- kind: ServiceAccount
  name: {{ .Values.serviceAccount.name }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{- /* The configuration's namespaces must be the ones the chart's Roles are in: canary
pods (each gpu_check, namespace gpuops unless it names one) in the release namespace,
driver pods in operatorNamespace. Otherwise the bot is refused at the first canary pod or
driver restart, in the middle of a run: refuse the values now instead. */ -}}
{{- define "gpuops.checkNamespaces" -}}
{{- $config := .Values.config | default dict }}
{{- $checks := dict }}
{{- $upgrades := $config.upgrades | default dict }}
{{- if kindIs "map" $upgrades.gpu_check }}
{{- $_ := set $checks "upgrades.gpu_check" $upgrades.gpu_check }}
{{- end }}
{{- range $name, $pool := ($config.pools | default dict) }}
{{- if and (kindIs "map" $pool) (kindIs "map" $pool.gpu_check) }}
{{- $_ := set $checks (printf "pools.%s.gpu_check" $name) $pool.gpu_check }}
{{- end }}
{{- end }}
{{- range $key, $check := $checks }}
{{- $namespace := dig "namespace" "gpuops" $check }}
{{- if and (dig "enabled" true $check) (ne $namespace $.Release.Namespace) }}
{{- fail (printf "config.%s runs canary pods in namespace %s, but the chart lets the bot create pods only in the release namespace %s: set its namespace to %s" $key $namespace $.Release.Namespace $.Release.Namespace) }}
{{- end }}
{{- end }}
{{- $cluster := $config.cluster | default dict }}
{{- if and $cluster.operator_namespace (ne $cluster.operator_namespace .Values.operatorNamespace) }}
{{- fail (printf "config.cluster.operator_namespace is %s but operatorNamespace is %s: the bot may delete driver pods only in operatorNamespace; make them the same" $cluster.operator_namespace .Values.operatorNamespace) }}
{{- end }}
{{- end -}}

{{/* "true" when the database is PostgreSQL (database.urlSecret.name set), "" for the SQLite file. */}}
{{- define "gpuops.postgres" -}}
{{- if .Values.database.urlSecret.name }}true{{ end -}}
{{- end }}
