{{/* The pod's parts, shared by the chart's Deployment and the patch for a Deployment of yours
     (existingDeployment): its containers, its volumes, and the pods it selects. */}}

{{/* The pods this release's Service, NetworkPolicy and monitors select. */}}
{{- define "hangup.podSelector" -}}
{{- if .Values.existingDeployment.name }}
{{- toYaml .Values.existingDeployment.selector }}
{{- else }}
{{- include "hangup.selectorLabels" . }}
{{- end }}
{{- end }}

{{/* The server container(s) the chart writes: the gateway, a preset's server, a custom one, or
     none (an edge). */}}
{{- define "hangup.serverContainers" -}}
{{- if eq .Values.server "gateway" }}
{{- include "hangup.gatewayContainer" . }}
{{- else if include "hangup.presetServer" . }}
{{- include "hangup.presetContainer" . }}
{{- else if .Values.modelServer.container }}
{{- include "hangup.modelServerContainer" . }}
{{- end }}
{{- end }}

{{/* A port of the proxy's as a Service or NetworkPolicy names it: by name, or by number for a
     native sidecar (an init container's named ports are not looked up everywhere). */}}
{{- define "hangup.proxyPort" -}}
{{- if .root.Values.proxy.nativeSidecar }}
{{- index .root.Values.proxy (printf "%sPort" .name) }}
{{- else }}
{{- .name }}
{{- end }}
{{- end }}

{{/* The volumes the proxy (and the chart's server container) mount. */}}
{{- define "hangup.podVolumes" -}}
{{- $m := .Values.modelServer }}
{{- $p := include "hangup.preset" . | fromYaml }}
{{- if include "hangup.tokenEnabled" . }}
- name: cancel-token
  secret:
    secretName: {{ include "hangup.tokenSecretName" . }}
    {{- if .Values.existingDeployment.name }}
    # Your pod has no fsGroup of the chart's: the proxy (uid 10001) reads the token as other.
    defaultMode: 0444
    {{- else }}
    defaultMode: 0440
    {{- end }}
{{- end }}
{{- if not .Values.existingDeployment.name }}
{{- if eq .Values.server "gateway" }}
- name: gateway-tmp
  emptyDir: {}
{{- if gt (int .Values.gateway.gpu.count) 0 }}
# vLLM and NCCL need more shared memory than the container runtime's 64 MiB default.
- name: gateway-shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.gateway.gpu.shmSize }}
{{- end }}
{{- else if include "hangup.presetServer" . }}
- name: server-tmp
  emptyDir: {}
{{- if and $p.shm $m.shmSize }}
- name: server-shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $m.shmSize }}
{{- end }}
{{- end }}
{{- end }}
- name: proxy-tmp
  emptyDir: {}
{{- end }}
