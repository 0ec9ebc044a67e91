{{- /* The agent image as one reference, from HAMi's {registry, repository, tag, pullPolicy} spelling:
empty registry = the runtime's default, empty tag = the chart's appVersion, tag sha256:<hex> = a digest. */ -}}
{{- define "vgpu-patch-agent.image" -}}
{{- /* No registry carries the default image: without a registry it could only be one loaded into every node by
hand (pullPolicy Never); anything else would install, then stay in ImagePullBackOff. */ -}}
{{- $img := .Values.image -}}
{{- if and (not $img.registry) (eq $img.repository "vgpu-patch-agent") (ne $img.pullPolicy "Never") -}}
{{- fail (print "image.registry is not set, and no registry has the image vgpu-patch-agent: build and push it "
  "first (deploy/build-multiarch.sh REGISTRY/vgpu-patch-agent:" .Chart.AppVersion " --push from a vgpu-patch "
  "checkout), then --set image.registry=REGISTRY; or --set image.pullPolicy=Never for an image loaded into "
  "every node by hand") -}}
{{- end -}}
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
