{{/* What Prometheus scrapes of a pod, for the ServiceMonitor and the PodMonitor alike: the
     proxy's admin port; the server's /metrics through the proxy's HTTP port (which relays it
     from loopback), or on its own metrics port where it has one (Triton). */}}
{{- define "hangup.scrapeEndpoints" -}}
{{- $v := .root.Values }}
{{- $metricsPort := (include "hangup.preset" .root | fromYaml).metricsPort }}
# The proxy's own metrics.
- port: admin
  path: /metrics
  interval: {{ .monitor.interval }}
  scrapeTimeout: {{ .monitor.scrapeTimeout }}
{{- if and $v.metrics.upstream.enabled $metricsPort }}
# The server's metrics, on its own metrics port.
- port: server-metrics
  path: /metrics
  interval: {{ .monitor.interval }}
  scrapeTimeout: {{ .monitor.scrapeTimeout }}
{{- else if $v.metrics.upstream.enabled }}
# The server's metrics, relayed by the proxy from loopback.
- port: http
  path: {{ include "hangup.metricsPath" .root }}
  interval: {{ .monitor.interval }}
  scrapeTimeout: {{ .monitor.scrapeTimeout }}
{{- end }}
{{- end }}

{{/* The monitoring objects' labels: the chart's, metrics.labels (kube-prometheus-stack's
     `release`), then the object's own. */}}
{{- define "hangup.monitoringLabels" -}}
{{- include "hangup.labels" .root }}
{{- with merge (deepCopy (.own | default dict)) .root.Values.metrics.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
