{{/* Labels every object carries. */}}
{{- define "raven.labels" -}}
app.kubernetes.io/part-of: raven
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "raven.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Pod security context: non-root, no fsGroup (it would make key files group-readable). */}}
{{- define "raven.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context of an L7-only container. */}}
{{- define "raven.securityContext" -}}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Container security context of an L3 container: root with NET_ADMIN only. */}}
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
Init container: Kubernetes mounts Secret files owned by root (and group-readable with fsGroup,
which Raven refuses), so the key is copied to a memory emptyDir, mode 0600, owned by uid 10001.
*/}}
{{- define "raven.keyInitContainer" -}}
- name: key-permissions
  image: {{ include "raven.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/bin/sh", "-c"]
  args:
    - cp /secrets/private.key /run/raven/keys/private.key && chmod 0600 /run/raven/keys/private.key && chown 10001:10001 /run/raven/keys/private.key
  securityContext:
    runAsNonRoot: false
    runAsUser: 0
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [CHOWN]
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 32Mi}
  volumeMounts:
    - name: key-secret
      mountPath: /secrets
      readOnly: true
    - name: keys
      mountPath: /run/raven/keys
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
