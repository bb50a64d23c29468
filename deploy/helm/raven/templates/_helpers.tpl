{{/* The chart's name, or nameOverride. */}}
{{- define "raven.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: fullnameOverride, else the release name (when it already
contains the chart's name), else <release>-<name>. */}}
{{- define "raven.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "raven.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "raven.labels" -}}
app.kubernetes.io/part-of: {{ include "raven.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The selector of one component: include with (list $ "gateway"). */}}
{{- define "raven.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/name: {{ include "raven.name" $ }}-{{ index . 1 }}
{{- end -}}

{{- define "raven.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "raven.imagePullSecrets" -}}
{{- with (concat (.Values.global.imagePullSecrets | default list) .Values.imagePullSecrets) }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The tunnel address agents dial: agent.gateway, else the headless tunnel Service. */}}
{{- define "raven.tunnelAddress" -}}
{{- if .Values.agent.gateway -}}
{{ .Values.agent.gateway }}
{{- else -}}
{{ include "raven.fullname" . }}-gateway-tunnel.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ .Values.gateway.ports.tunnel }}
{{- end -}}
{{- end -}}

{{/* Pod security context (Pod Security "restricted"): non-root, RuntimeDefault seccomp.
fsGroup lets the non-root init container read the Secret (mode 0440, group 10001); the app
reads only its 0600 copy. */}}
{{- define "raven.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context of an L7-only container. */}}
{{- define "raven.securityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Container security context of an L3 container: root with NET_ADMIN only (the documented
exception to Pod Security "restricted"). */}}
{{- define "raven.l3SecurityContext" -}}
runAsNonRoot: false
runAsUser: 0
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
  add: [NET_ADMIN]
{{- end -}}

{{/*
Init container, non-root: Raven refuses a key (or admin token) file others can read, and a
Secret volume's files are group-readable (fsGroup); they are copied to a memory emptyDir, mode
0600, owned by the running user.
*/}}
{{- define "raven.keyInitContainer" -}}
- name: key-permissions
  image: {{ include "raven.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - install
    - -m
    - "0600"
    - -t
    - /run/raven/keys
    - /secrets/private.key
    {{- if .Values.adminToken.existingSecret }}
    - /admin-token/admin.token
    {{- end }}
  securityContext:
    {{- include "raven.securityContext" . | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 32Mi}
  volumeMounts:
    - name: key-secret
      mountPath: /secrets
      readOnly: true
    {{- if .Values.adminToken.existingSecret }}
    - name: admin-token
      mountPath: /admin-token
      readOnly: true
    {{- end }}
    - name: keys
      mountPath: /run/raven/keys
{{- end -}}

{{/* The admin token Secret's volume (adminToken.existingSecret), read by the init container. */}}
{{- define "raven.adminTokenVolume" -}}
{{- if .Values.adminToken.existingSecret }}
- name: admin-token
  secret:
    secretName: {{ .Values.adminToken.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.adminToken.key }}
        path: admin.token
{{- end }}
{{- end -}}

{{/* Config lines for the admin token. */}}
{{- define "raven.adminTokenConfig" -}}
{{- if .Values.adminToken.existingSecret }}
admin_token_file: /run/raven/keys/admin.token
{{- end }}
{{- end -}}

{{/* Volumes for the key copy and /tmp. */}}
{{- define "raven.keyVolumes" -}}
- name: keys
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- end -}}

{{/* Labels of a monitoring object: the chart's plus the ones its operator selects on. */}}
{{- define "raven.monitoringLabels" -}}
{{- $ := index . 0 -}}
{{ include "raven.labels" $ }}
{{- with index . 1 }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Backfill (docs/backfill.md) ------------------------------------------------------------ */}}

{{/* Where the agent's buffer volume is mounted: the agent config's backfill.dir. */}}
{{- define "raven.bufferDir" -}}
/var/lib/raven
{{- end -}}

{{/* The agent config's backfill section: the chart's values, agent.backfill.extraConfig
(snake_case config fields) over them, and the buffer's directory where the chart mounts its
volume. toYaml keeps large integers integers. */}}
{{- define "raven.agentBackfillConfig" -}}
{{- $bf := .Values.agent.backfill -}}
{{- $cfg := dict "max_bytes" ($bf.maxBytes | int64) "max_age_s" $bf.maxAgeSeconds "synchronous" $bf.synchronous -}}
{{- $cfg = mergeOverwrite $cfg (deepCopy ($bf.extraConfig | default dict)) -}}
{{- $_ := set $cfg "enabled" true -}}
{{- $_ = set $cfg "dir" (include "raven.bufferDir" .) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The gateway config's backfill section. Jobs: gateway.backfill.jobs, else one per
scrapeConfig.ports with the job name the chart's ScrapeConfig gives it (raven-edge-<port>) and
its http_sd target labels. */}}
{{- define "raven.gatewayBackfillConfig" -}}
{{- $bf := .Values.gateway.backfill -}}
{{- $jobs := list -}}
{{- if $bf.jobs -}}
{{- range $bf.jobs -}}
{{- $job := dict "port" (.port | int) "job" .job -}}
{{- if .instance }}{{ $_ := set $job "instance" .instance }}{{ end -}}
{{- if hasKey . "honorLabels" }}{{ $_ := set $job "honor_labels" .honorLabels }}{{ end -}}
{{- if hasKey . "discoveryLabels" }}{{ $_ := set $job "discovery_labels" .discoveryLabels }}{{ end -}}
{{- if .labels }}{{ $_ := set $job "labels" .labels }}{{ end -}}
{{- if .mode }}{{ $_ := set $job "mode" .mode }}{{ end -}}
{{- if .path }}{{ $_ := set $job "path" .path }}{{ end -}}
{{- $jobs = append $jobs $job -}}
{{- end -}}
{{- else if .Values.scrapeConfig.enabled -}}
{{- range .Values.scrapeConfig.ports -}}
{{- $jobs = append $jobs (dict "port" (. | int) "job" (printf "raven-edge-%d" (. | int)) "discovery_labels" true) -}}
{{- end -}}
{{- else -}}
{{- fail "gateway.backfill.enabled needs gateway.backfill.jobs (the Prometheus job of each edge port), or scrapeConfig.enabled (one job per scrapeConfig.ports)" -}}
{{- end -}}
{{- $cfg := dict "enabled" true "remote_write_url" $bf.remoteWriteUrl "out_of_order_window_s" $bf.outOfOrderWindowSeconds "max_clock_skew_s" $bf.maxClockSkewSeconds "timeout_s" $bf.timeoutSeconds "max_retry_after_s" ($bf.maxRetryAfterSeconds | default 300) "receivers" ($bf.receivers | default "shared") "jobs" $jobs -}}
{{- if ne (eq ($bf.receivers | default "shared") "per_scraper") (contains "{scraper}" $bf.remoteWriteUrl) -}}
{{- fail "gateway.backfill: remoteWriteUrl holds {scraper} exactly when receivers is per_scraper (e.g. http://{scraper}:9090/api/v1/write)" -}}
{{- end -}}
{{- $client := include "raven.remoteWriteClient" . | fromYaml -}}
{{- if $client }}{{ $_ := set $cfg "remote_write" $client }}{{ end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The gateway's backfill.remote_write section from gateway.backfill.remoteWrite: files
     of the Secret mounted at /etc/raven/remote-write (raven.remoteWriteVolume). */}}
{{- define "raven.remoteWriteClient" -}}
{{- $rw := .Values.gateway.backfill.remoteWrite | default dict -}}
{{- $dir := "/etc/raven/remote-write" -}}
{{- $basic := $rw.basicAuth | default dict -}}
{{- $tls := $rw.tls | default dict -}}
{{- $keys := list $rw.bearerTokenKey $basic.passwordKey $tls.caKey $tls.certKey $tls.keyKey | compact -}}
{{- if and $keys (not $rw.secretName) -}}
{{- fail "gateway.backfill.remoteWrite: the *Key settings name keys of remoteWrite.secretName, which is empty" -}}
{{- end -}}
{{- if and $rw.bearerTokenKey $basic.username -}}
{{- fail "gateway.backfill.remoteWrite: bearerTokenKey and basicAuth exclude each other" -}}
{{- end -}}
{{- if ne (empty $basic.username) (empty $basic.passwordKey) -}}
{{- fail "gateway.backfill.remoteWrite.basicAuth: username and passwordKey go together" -}}
{{- end -}}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) -}}
{{- fail "gateway.backfill.remoteWrite.tls: certKey and keyKey go together" -}}
{{- end -}}
{{- $out := dict -}}
{{- if $rw.bearerTokenKey }}{{ $_ := set $out "bearer_token_file" (printf "%s/%s" $dir $rw.bearerTokenKey) }}{{ end -}}
{{- if $basic.username }}{{ $_ := set $out "basic_auth" (dict "username" $basic.username "password_file" (printf "%s/%s" $dir $basic.passwordKey)) }}{{ end -}}
{{- $t := dict -}}
{{- if $tls.caKey }}{{ $_ := set $t "ca_file" (printf "%s/%s" $dir $tls.caKey) }}{{ end -}}
{{- if $tls.certKey }}{{ $_ := set $t "cert_file" (printf "%s/%s" $dir $tls.certKey) }}{{ $_ := set $t "key_file" (printf "%s/%s" $dir $tls.keyKey) }}{{ end -}}
{{- if $tls.serverName }}{{ $_ := set $t "server_name" $tls.serverName }}{{ end -}}
{{- if $tls.insecureSkipVerify }}{{ $_ := set $t "insecure_skip_verify" true }}{{ end -}}
{{- if $t }}{{ $_ := set $out "tls_config" $t }}{{ end -}}
{{- if $rw.headers }}{{ $_ := set $out "headers" $rw.headers }}{{ end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
{{- end -}}

{{/* The spec of an agent's buffer PersistentVolumeClaim (agent.backfill.persistence). */}}
{{- define "raven.bufferClaimSpec" -}}
{{- $p := .Values.agent.backfill.persistence -}}
accessModes:
  {{- toYaml $p.accessModes | nindent 2 }}
{{- if eq $p.storageClass "-" }}
storageClassName: ""
{{- else if $p.storageClass }}
storageClassName: {{ $p.storageClass | quote }}
{{- end }}
resources:
  requests:
    storage: {{ $p.size }}
{{- end -}}
