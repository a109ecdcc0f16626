{{/*
sockmesh.values: the values in force, as YAML. Lowest first: the chart's defaults
(_internal_defaults_do_not_set), the profile's preset (files/profile-<profile>.yaml), then the
user's own top-level values. Every template reads these, never .Values directly.
*/}}
{{- define "sockmesh.values" -}}
{{- $defaults := deepCopy (index .Values "_internal_defaults_do_not_set") -}}
{{- $name := .Values.profile | default "default" -}}
{{- $file := printf "files/profile-%s.yaml" $name -}}
{{- $text := .Files.Get $file -}}
{{- if not $text -}}
{{- fail (printf "profile %q does not exist: use --set profile=default or --set profile=ambient" $name) -}}
{{- end -}}
{{- $profile := fromYaml $text -}}
{{- $user := omit (deepCopy .Values) "_internal_defaults_do_not_set" "profile" -}}
{{- $merged := mergeOverwrite $defaults $profile $user -}}
{{- $_ := set $merged "profile" $name -}}
{{- toYaml $merged -}}
{{- end -}}

{{- define "sockmesh.image" -}}
{{- if .hub -}}{{ .hub }}/{{ .image }}:{{ .tag }}{{- else -}}{{ .image }}:{{ .tag }}{{- end -}}
{{- end -}}

{{- define "sockmesh.labels" -}}
app.kubernetes.io/name: sockmesh
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sockmesh.caAddress" -}}
{{- .caAddress | default (printf "istiod.%s.svc:15012" .istioNamespace) -}}
{{- end -}}
{{- define "sockmesh.xdsAddress" -}}
{{- .xdsAddress | default (printf "istiod.%s.svc:15012" .istioNamespace) -}}
{{- end -}}

{{/* ztunnel's downward-API env names. */}}
{{- define "sockmesh.downwardEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: INSTANCE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: SERVICE_ACCOUNT
  valueFrom:
    fieldRef:
      fieldPath: spec.serviceAccountName
{{- end -}}

{{- define "sockmesh.userEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}
