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
