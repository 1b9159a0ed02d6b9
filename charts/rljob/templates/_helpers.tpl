{{/* Names, labels and the checks no schema can express. */}}

{{- define "rljob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rljob.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rljob.labels" -}}
{{ include "rljob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rljob
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "rljob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rljob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rljob.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if not $tag -}}
{{- fail "image.tag is empty and the chart has no appVersion: set image.tag" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "rljob.leaseName" -}}
{{- printf "%s-leader" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rljob.validate" -}}
{{- $le := .Values.leaderElection -}}
{{- if and (gt (int .Values.replicas) 1) (not $le.enabled) -}}
{{- fail (printf "replicas: %d needs leaderElection.enabled: true; without leader election every replica would reconcile the same jobs" (int .Values.replicas)) -}}
{{- end -}}
{{- if $le.enabled -}}
{{- if le (int $le.leaseDurationSeconds) (int $le.renewDeadlineSeconds) -}}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%d) must be less than leaderElection.leaseDurationSeconds (%d): a leader must give up before another replica may take over" (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds)) -}}
{{- end -}}
{{- if le (float64 $le.renewDeadlineSeconds) (mulf 1.2 (float64 $le.retryPeriodSeconds)) -}}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%d) must be more than 1.2 times leaderElection.retryPeriodSeconds (%d): a leader must have time to renew at least once" (int $le.renewDeadlineSeconds) (int $le.retryPeriodSeconds)) -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.namespaceMode "namespaced") (not .Values.watchNamespaces) -}}
{{- fail "namespaceMode: namespaced needs watchNamespaces: the namespaces the operator serves (at least one)" -}}
{{- end -}}
{{- if and (eq .Values.namespaceMode "cluster") .Values.watchNamespaces -}}
{{- fail "watchNamespaces is only used with namespaceMode: namespaced; the cluster mode watches every namespace" -}}
{{- end -}}
{{- if and .Values.operator.secretPreflight (ne .Values.namespaceMode "namespaced") -}}
{{- fail "operator.secretPreflight needs namespaceMode: namespaced: it grants `get secrets` in each watched namespace, never cluster-wide" -}}
{{- end -}}
{{- end -}}
