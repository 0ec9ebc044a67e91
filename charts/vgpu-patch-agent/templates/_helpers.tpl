{{- /* The agent image as one reference, from HAMi's {registry, repository, tag, pullPolicy} spelling:
empty registry = the runtime's default, empty tag = the chart's appVersion, tag sha256:<hex> = a digest. */ -}}
{{- define "vgpu-patch-agent.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- $image := .Values.image.repository -}}
{{- if .Values.image.registry -}}
{{- $image = printf "%s/%s" .Values.image.registry $image -}}
{{- end -}}
{{- if hasPrefix "sha256:" $tag -}}
{{- printf "%s@%s" $image $tag -}}
{{- else -}}
{{- printf "%s:%s" $image $tag -}}
{{- end -}}
{{- end -}}
