{{- define "weft.labels" -}}
app.kubernetes.io/name: weft
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
