{{/* Names, labels, and the pieces every process's pod shares. */}}

{{- define "durable.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "durable.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "worker") */}}
{{- define "durable.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "durable.secretName" -}}
{{- .Values.secret.existing | default (printf "%s-secrets" (include "durable.fullname" .)) -}}
{{- end -}}

{{- define "durable.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "durable.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "durable.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The checks a wrong configuration fails on, each naming the value to fix. */}}
{{- define "durable.validate" -}}
{{- $url := required "redis.url is required: the log's Redis, redis://host:6379/0 or rediss://..." .Values.redis.url -}}
{{- $scheme := (urlParse $url).scheme -}}
{{- if not (has $scheme (list "redis" "rediss")) -}}
{{- fail (printf "redis.url must be a redis:// or rediss:// URL, not %q" $scheme) -}}
{{- end -}}
{{- if (urlParse $url).userinfo -}}
{{- fail "redis.url must not hold a password: put it in the Secret (redis-password, or <role>-password with redis.acl)" -}}
{{- end -}}
{{- if and .Values.redis.cluster (not .Values.redis.queueUrl) -}}
{{- fail "redis.queueUrl is required with redis.cluster: RQ and the ready lists need a plain Redis" -}}
{{- end -}}
{{- if .Values.redis.queueUrl -}}
{{- if (urlParse .Values.redis.queueUrl).userinfo -}}
{{- fail "redis.queueUrl must not hold a password: put it in the Secret" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.redis.tls.secretName (ne $scheme "rediss") -}}
{{- fail "redis.tls.secretName is set but redis.url is not rediss://: the connection would not be encrypted" -}}
{{- end -}}
{{- if not .Values.secret.existing -}}
{{- range $role := (ternary (list "worker" "reconciler" "operator") (list "redis") .Values.redis.acl) -}}
{{- $key := ternary (printf "%s-password" $role) "redis-password" $.Values.redis.acl -}}
{{- if not (hasKey $.Values.secret.data $key) -}}
{{- fail (printf "secret.data.%s is required (or secret.existing: a Secret of your own that holds it)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.console.enabled (not (hasKey .Values.secret.data "console-users")) -}}
{{- fail "secret.data.console-users is required with console.enabled: the console's users file (docs/operations.md, Console)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A container's env: the ConfigMap, then the role's Redis user and the keys.
     (dict "root" $ "role" "worker") */}}
{{- define "durable.env" -}}
{{- $secret := include "durable.secretName" .root -}}
{{- if .root.Values.redis.acl }}
- name: DURABLE_REDIS_USERNAME
  value: {{ .role }}
{{- end }}
- name: DURABLE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ ternary (printf "%s-password" .role) "redis-password" .root.Values.redis.acl }}
{{- range $name, $key := dict "DURABLE_ADMIN_KEYS" "admin-keys" "DURABLE_ENCRYPTION_KEYS" "encryption-keys" "DURABLE_CANCEL_SECRET" "cancel-secret" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end -}}

{{/* Pod-level fields every process shares. */}}
{{- define "durable.podSpec" -}}
serviceAccountName: {{ include "durable.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "durable.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.redis.tls.secretName }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- with .Values.agentsVolume }}
- name: agents
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "durable.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.redis.tls.secretName }}
- name: redis-tls
  mountPath: /etc/durable/tls
  readOnly: true
{{- end }}
{{- if .Values.agentsVolume }}
- name: agents
  mountPath: /agents
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod annotations: a checksum of the settings, so that a change rolls the pods. */}}
{{- define "durable.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}
