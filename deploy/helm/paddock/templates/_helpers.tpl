{{/* The release's base name (all objects are named from it). */}}
{{- define "paddock.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "paddock.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "paddock.selector" (list . "api"). */}}
{{- define "paddock.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "paddock.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding the keys: the provider's, or the one this chart keeps. */}}
{{- define "paddock.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-keys" (include "paddock.fullname" .)) -}}
{{- end -}}

{{- define "paddock.stacksMounted" -}}
{{- if or .Values.stacks.image.reference .Values.stacks.persistentVolumeClaim.claimName -}}true{{- end -}}
{{- end -}}

{{/* One variable from the keys Secret; optional ones may be absent from an existing Secret. */}}
{{- define "paddock.secretEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "paddock.secretName" $root }}
      key: {{ index . 1 }}
      {{- if index . 2 }}
      optional: true
      {{- end }}
{{- end -}}

{{/* TLS to PostgreSQL (database.*), for every process and the migration Job. */}}
{{- define "paddock.databaseTlsEnv" -}}
- { name: PGSSLMODE, value: {{ .Values.database.sslMode | quote }} }
{{- if .Values.database.caSecret }}
- { name: PGSSLROOTCERT, value: /etc/paddock/database-ca/ca.crt }
{{- end }}
{{- end -}}

{{/* The environment of the API and worker processes (docs/configuration.md). */}}
{{- define "paddock.env" -}}
{{- $v := .Values -}}
- { name: PADDOCK_LISTEN, value: "0.0.0.0:8080" }
{{ include "paddock.secretEnv" (list . "PADDOCK_DATABASE_URL" false) }}
{{ include "paddock.databaseTlsEnv" . }}
{{ include "paddock.secretEnv" (list . "PADDOCK_ENCRYPTION_KEY" false) }}
{{ include "paddock.secretEnv" (list . "PADDOCK_ENCRYPTION_OLD_KEYS" true) }}
{{ include "paddock.secretEnv" (list . "PADDOCK_LEDGER_KEY" false) }}
{{ include "paddock.secretEnv" (list . "PADDOCK_USAGE_SIGNING_KEY" true) }}
{{ include "paddock.secretEnv" (list . "PADDOCK_JWT_HS256_SECRET" true) }}
- { name: PADDOCK_LOG_FORMAT, value: json }
- { name: PADDOCK_METRICS_LISTEN, value: {{ printf "0.0.0.0:%v" $v.metrics.port | quote }} }
- { name: PADDOCK_JWT_ISSUER, value: {{ $v.jwt.issuer | quote }} }
- { name: PADDOCK_JWT_AUDIENCE, value: {{ $v.jwt.audience | quote }} }
{{- with $v.jwt.jwksUrl }}
- { name: PADDOCK_JWT_JWKS_URL, value: {{ . | quote }} }
{{- end }}
{{- if $v.jwt.publicKeysSecret }}
- { name: PADDOCK_JWT_PUBLIC_KEYS, value: /etc/paddock/jwt }
{{- end }}
{{- range $name, $value := dict "PADDOCK_CONSOLE_OIDC_DISCOVERY_URL" $v.console.oidc.discoveryUrl "PADDOCK_CONSOLE_OIDC_CLIENT_ID" $v.console.oidc.clientId "PADDOCK_CONSOLE_OIDC_REDIRECT_URI" $v.console.oidc.redirectUri }}
{{- if $value }}
- { name: {{ $name }}, value: {{ $value | quote }} }
{{- end }}
{{- end }}
{{- if ne $v.console.oidc.scopes "openid" }}
- { name: PADDOCK_CONSOLE_OIDC_SCOPES, value: {{ $v.console.oidc.scopes | quote }} }
{{- end }}
- { name: PADDOCK_KUBE_DRIVER, value: {{ $v.drivers.kube | quote }} }
{{- if eq $v.drivers.kube "kubernetes" }}
- { name: PADDOCK_KUBE_NAMESPACE_ROLE, value: {{ printf "%s-worker-namespace" (include "paddock.fullname" .) | quote }} }
{{- end }}
- { name: PADDOCK_BMC_DRIVER, value: {{ $v.drivers.bmc | quote }} }
{{- with $v.agent.baseUrl }}
- { name: PADDOCK_AGENT_BASE_URL, value: {{ . | quote }} }
{{- end }}
{{- with $v.agent.seedBaseUrl }}
- { name: PADDOCK_AGENT_SEED_BASE_URL, value: {{ . | quote }} }
{{- end }}
{{- if $v.agent.insecureHttp }}
- { name: PADDOCK_AGENT_INSECURE_HTTP, value: "true" }
{{- end }}
{{- if $v.agent.service.enabled }}
- { name: PADDOCK_AGENT_LISTEN, value: {{ printf "0.0.0.0:%v" $v.agent.listenPort | quote }} }
{{- end }}
{{- range $name, $value := dict "PADDOCK_WIPE_IMAGE_URL" $v.images.wipeUrl "PADDOCK_WIPE_IMAGE_SHA256" $v.images.wipeSha256 "PADDOCK_OS_IMAGE_URL" $v.images.osUrl "PADDOCK_OS_IMAGE_SHA256" $v.images.osSha256 }}
{{- if $value }}
- { name: {{ $name }}, value: {{ $value | quote }} }
{{- end }}
{{- end }}
{{- with $v.webhooks.publicUrl }}
- { name: PADDOCK_PUBLIC_URL, value: {{ . | quote }} }
{{- end }}
{{- if $v.webhooks.insecureHttp }}
- { name: PADDOCK_WEBHOOK_INSECURE_HTTP, value: "true" }
{{- end }}
{{- with $v.webhooks.allowedNetworks }}
- { name: PADDOCK_WEBHOOK_ALLOWED_NETWORKS, value: {{ join "," . | quote }} }
{{- end }}
{{- with $v.identity.idRange }}
- { name: PADDOCK_IDENTITY_ID_RANGE, value: {{ . | quote }} }
{{- end }}
{{- if include "paddock.stacksMounted" . }}
- { name: PADDOCK_STACKS_DIR, value: /var/lib/paddock/stacks }
{{- end }}
{{- with $v.slurm.imageRegistry }}
- { name: PADDOCK_SLURM_IMAGE_REGISTRY, value: {{ . | quote }} }
{{- end }}
{{- range $name, $value := $v.config }}
- { name: {{ $name }}, value: {{ $value | toString | quote }} }
{{- end }}
{{- end -}}

{{- define "paddock.volumeMounts" -}}
- { name: tmp, mountPath: /tmp }
{{- if include "paddock.stacksMounted" . }}
- { name: stacks, mountPath: /var/lib/paddock/stacks, readOnly: true }
{{- end }}
{{- if .Values.jwt.publicKeysSecret }}
- { name: jwt-keys, mountPath: /etc/paddock/jwt, readOnly: true }
{{- end }}
{{- include "paddock.databaseCaMount" . }}
{{- end -}}

{{- define "paddock.databaseCaMount" -}}
{{- if .Values.database.caSecret }}
- { name: database-ca, mountPath: /etc/paddock/database-ca, readOnly: true }
{{- end }}
{{- end -}}

{{- define "paddock.databaseCaVolume" -}}
{{- with .Values.database.caSecret }}
- name: database-ca
  secret: { secretName: {{ . | quote }} }
{{- end }}
{{- end -}}

{{- define "paddock.volumes" -}}
- name: tmp
  emptyDir: { sizeLimit: 64Mi }
{{- with .Values.stacks.image.reference }}
- name: stacks
  image: { reference: {{ . | quote }}, pullPolicy: {{ $.Values.stacks.image.pullPolicy }} }
{{- else }}
{{- with .Values.stacks.persistentVolumeClaim.claimName }}
- name: stacks
  persistentVolumeClaim: { claimName: {{ . | quote }}, readOnly: true }
{{- end }}
{{- end }}
{{- with .Values.jwt.publicKeysSecret }}
- name: jwt-keys
  secret: { secretName: {{ . | quote }} }
{{- end }}
{{- include "paddock.databaseCaVolume" . }}
{{- end -}}

{{/* Prometheus scrape annotations of a pod template. */}}
{{- define "paddock.podAnnotations" -}}
{{- $root := index . 0 -}}
{{- $extra := index . 1 -}}
{{- if or $root.Values.metrics.annotations $extra -}}
annotations:
  {{- if $root.Values.metrics.annotations }}
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ $root.Values.metrics.port | quote }}
  prometheus.io/path: /metrics
  {{- end }}
  {{- with $extra }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* Spread a component's pods over nodes (preferred: a one-node lab still schedules them). */}}
{{- define "paddock.affinity" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "paddock.selector" . | nindent 14 }}
{{- end -}}
