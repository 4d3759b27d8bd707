{{/* Names, labels and the derived settings every template shares. */}}

{{- define "hangup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hangup.fullname" -}}
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

{{- define "hangup.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hangup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hangup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hangup.labels" -}}
helm.sh/chart: {{ include "hangup.chart" . }}
{{ include "hangup.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hangup
{{- end }}

{{- define "hangup.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hangup.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hangup.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "hangup.proxyImage" -}}
{{- $repo := .Values.proxy.image.repository | default .Values.image.repository }}
{{- $tag := .Values.proxy.image.tag | default .Values.image.tag | default .Chart.AppVersion }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Whether a cancel token exists at all: the gateway always takes one; the `hangup` adapter
     sends it; with a preset the sidecar answers the cancel by id behind it. */}}
{{- define "hangup.tokenEnabled" -}}
{{- if or (eq .Values.server "gateway") (eq (include "hangup.adapter" .) "hangup") (include "hangup.presetServer" .) .Values.modelServer.mountCancelToken }}true{{ end }}
{{- end }}

{{- define "hangup.tokenSecretName" -}}
{{- .Values.cancelToken.existingSecret | default (printf "%s-cancel-token" (include "hangup.fullname" .)) }}
{{- end }}

{{- define "hangup.tokenPath" -}}
/var/run/hangup/cancel-token/{{ .Values.cancelToken.key }}
{{- end }}

{{- define "hangup.upstreamHttp" -}}
{{- if eq .Values.server "gateway" }}
{{- printf "http://127.0.0.1:%d" (int .Values.gateway.httpPort) }}
{{- else if include "hangup.presetServer" . }}
{{- printf "http://127.0.0.1:%d" (int .Values.modelServer.httpPort) }}
{{- else }}
{{- .Values.modelServer.upstreamHttp }}
{{- end }}
{{- end }}

{{/* The gateway's gRPC address; with several API processes, each one's own port: the proxy
     spreads its calls over them (one connection to the shared port reaches one process). */}}
{{- define "hangup.upstreamGrpc" -}}
{{- $g := .Values.gateway }}
{{- $gateway := eq .Values.server "gateway" }}
{{- if and $gateway (gt (int $g.apiProcesses) 1) }}
{{- $ports := list }}
{{- range $k := until (int $g.apiProcesses) }}
{{- $ports = append $ports (printf "127.0.0.1:%d" (add (int $g.grpcProcessPorts) $k)) }}
{{- end }}
{{- join "," $ports }}
{{- else if $gateway }}
{{- printf "127.0.0.1:%d" (int $g.grpcPort) }}
{{- else if eq .Values.server "triton" }}
{{- printf "127.0.0.1:%d" (int .Values.modelServer.grpcPort) }}
{{- else if include "hangup.presetServer" . }}
{{- else }}
{{- .Values.modelServer.upstreamGrpc }}
{{- end }}
{{- end }}

{{/* Seconds the upstream (gateway or model server) keeps serving after the pod is told to stop:
     until the proxy has drained and its shutdown cancels have landed or given up. */}}
{{- define "hangup.upstreamPreStopSeconds" -}}
{{- add .Values.shutdown.preStopSeconds .Values.proxy.drainTimeoutSeconds .Values.proxy.cancelDeadlineSeconds }}
{{- end }}

{{/* The server's own stop after its SIGTERM: the gateway's drain, a server of yours'
     modelServer.drainTimeoutSeconds (none for an edge, which runs no server in the pod). */}}
{{- define "hangup.serverDrainSeconds" -}}
{{- if eq .Values.server "gateway" }}
{{- .Values.gateway.drainTimeoutSeconds }}
{{- else if or (include "hangup.presetServer" .) .Values.modelServer.container .Values.existingDeployment.container }}
{{- .Values.modelServer.drainTimeoutSeconds }}
{{- else }}
{{- 0 }}
{{- end }}
{{- end }}

{{- define "hangup.requiredGraceSeconds" -}}
{{- add (include "hangup.upstreamPreStopSeconds" . | int) (include "hangup.serverDrainSeconds" . | int) }}
{{- end }}

{{- define "hangup.terminationGracePeriodSeconds" -}}
{{- $required := include "hangup.requiredGraceSeconds" . | int }}
{{- $set := .Values.shutdown.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $set }}
{{- add $required .Values.shutdown.marginSeconds }}
{{- else if lt (int $set) $required }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds=%d is shorter than the %ds the pod needs to drain (shutdown.preStopSeconds + proxy.drainTimeoutSeconds + proxy.cancelDeadlineSeconds + the server's gateway.drainTimeoutSeconds or modelServer.drainTimeoutSeconds): a rollout would cut streams short without cancelling them" (int $set) $required) }}
{{- else }}
{{- $set }}
{{- end }}
{{- end }}

{{/* The model `helm test` and the notes call; empty: the server's first (GET /v1/models). */}}
{{- define "hangup.testModel" -}}
{{- if .Values.test.model }}
{{- .Values.test.model }}
{{- else if eq .Values.server "gateway" }}
{{- .Values.gateway.servedModelName | default .Values.gateway.model | default "hangup-sim" }}
{{- else if eq .Values.server "truss" }}
{{- "model" }}
{{- end }}
{{- end }}

{{/* The proxy's --workers: proxy.workers, or (0) one per CPU of its CPU limit, rounded up. */}}
{{- define "hangup.proxyWorkers" -}}
{{- $p := .Values.proxy -}}
{{- if gt (int $p.workers) 0 }}
{{- $p.workers }}
{{- else }}
{{- $cpu := toString (dig "limits" "cpu" "" ($p.resources | default dict)) }}
{{- if not $cpu }}
{{- 1 }}
{{- else if hasSuffix "m" $cpu }}
{{- max 1 (ceil (divf (trimSuffix "m" $cpu | float64) 1000)) }}
{{- else }}
{{- max 1 (ceil ($cpu | float64)) }}
{{- end }}
{{- end }}
{{- end }}
