{{/*
Names. Every object of a release is named from the release (`weft.fullname`), so two releases in one namespace
never collide; the one exception is the node agent's service account, whose name istiod must trust (see values).
*/}}
{{- define "weft.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weft.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The plugin control plane's name: the release's name plus "-control" (within 63 characters). */}}
{{- define "weft.controlName" -}}
{{- printf "%s-control" (include "weft.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "weft.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "weft.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Pod template labels: the selector's and the version, never helm.sh/chart: a chart upgrade that changes nothing in
the pod must not restart every node proxy (and drop the node's connections).
*/}}
{{- define "weft.podLabels" -}}
{{ include "weft.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* What selects a release's pods; `app.kubernetes.io/component` (node-proxy, control) tells its two kinds apart. */}}
{{- define "weft.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weft.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "weft.serviceAccountName" -}}
{{- required "serviceAccount.name must be set" .Values.serviceAccount.name }}
{{- end }}

{{/* Whether the chart creates the node proxy's service account: not in migration mode, where it is ztunnel's. */}}
{{- define "weft.createServiceAccount" -}}
{{- if and .Values.serviceAccount.create (not .Values.migration.fromZtunnel) }}true{{ end }}
{{- end }}

{{/* The node proxy's container name: ztunnel's (`istio-proxy`) when it is to look like ztunnel. */}}
{{- define "weft.containerName" -}}
{{- if .Values.ztunnelLabels }}istio-proxy{{ else }}weft{{ end }}
{{- end }}

{{/* An image pull secret, given by name (ztunnel's chart's form) or as {name: ...} (the pod spec's). */}}
{{- define "weft.pullSecrets" -}}
{{- range . }}
- name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}

{{/*
The image reference: by digest when `image.digest` is set (what a production install should pin), else by tag
(default: the chart's appVersion).
*/}}
{{- define "weft.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
An integer, printed as an integer. Helm decodes every number in values as a float64, and Go prints a float64 of
1,000,000 or more in scientific notation (1.048576e+06), which no flag parser accepts: every number the chart
writes into a flag goes through here.
*/}}
{{- define "weft.int" -}}
{{- printf "%d" (int64 .) }}
{{- end }}

{{/*
`mark` as weft's --mark expects it: a string is passed as written (the schema allows decimal or 0x hex), a number
(YAML reads `0x539` as 1337) is written as hex.
*/}}
{{/* A value for an environment variable: whole numbers as integers (see weft.int), the rest as written. */}}
{{- define "weft.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 .) (floor .)) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{- define "weft.mark" -}}
{{- if kindIs "string" . }}
{{- . }}
{{- else }}
{{- printf "0x%x" (int64 .) }}
{{- end }}
{{- end }}

{{/* istiod's Service for this revision. */}}
{{- define "weft.istiodHost" -}}
{{- printf "istiod%s.%s.svc" (ternary "" (printf "-%s" .Values.istio.revision) (eq .Values.istio.revision "")) .Values.istio.namespace }}
{{- end }}

{{/*
An istiod address as weft takes it: ztunnel's form `host:port` (no scheme) becomes https://host:port, since weft's CA
client refuses an address without a scheme; one with a scheme is passed as written.
*/}}
{{- define "weft.https" -}}
{{- if contains "://" . }}{{ . }}{{ else }}{{ printf "https://%s" . }}{{ end }}
{{- end }}

{{- define "weft.caAddress" -}}
{{- include "weft.https" (.Values.istio.caAddress | default (printf "%s:15012" (include "weft.istiodHost" .))) }}
{{- end }}

{{- define "weft.xdsAddress" -}}
{{- include "weft.https" (.Values.istio.xdsAddress | default (printf "%s:15012" (include "weft.istiodHost" .))) }}
{{- end }}

{{/* Where nodes reach plugins over xDS: an explicit address, else this release's control plane when enabled. */}}
{{- define "weft.pluginXdsAddress" -}}
{{- if .Values.plugins.xds.address }}
{{- include "weft.https" .Values.plugins.xds.address }}
{{- else if .Values.control.enabled }}
{{- printf "https://%s.%s.svc:%s" (include "weft.controlName" .) .Release.Namespace (include "weft.int" .Values.control.port) }}
{{- end }}
{{- end }}

{{/* Whether weft gets a local config file: the trial mesh, or plugins from a ConfigMap. */}}
{{- define "weft.hasLocalConfig" -}}
{{- if or .Values.trial.enabled .Values.plugins.local }}true{{- end }}
{{- end }}

{{/*
The local config file (ztunnel's local-config format plus `plugins`): the trial mesh as written, then the plugins
whose code is in `plugins.configMap` (a relative `path` names a key of that ConfigMap).
*/}}
{{- define "weft.localConfig" -}}
{{- $plugins := list }}
{{- range .Values.plugins.local }}
{{- $p := deepCopy . }}
{{- if and (hasKey $p "path") (not (hasPrefix "/" $p.path)) }}
{{- $_ := set $p "path" (printf "/etc/weft/plugins/%s" $p.path) }}
{{- end }}
{{- $plugins = append $plugins $p }}
{{- end }}
{{- if .Values.trial.enabled }}
{{- if and $plugins (regexMatch "(?m)^plugins:" .Values.trial.mesh) }}
{{- fail "trial.mesh has its own `plugins:`; put the plugins there or in plugins.local, not both" }}
{{- end }}
{{- .Values.trial.mesh | trim }}
{{- if $plugins }}{{ "\n" }}{{ end }}
{{- end }}
{{- if $plugins }}
{{- toYaml (dict "plugins" $plugins) }}
{{- end }}
{{- end }}
