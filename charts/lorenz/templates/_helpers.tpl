{{/*
Names and labels shared by every template. Kubernetes names are capped at 63 characters, so
each helper truncates and trims a trailing "-" left by the cut.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "lorenz.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release-qualified name used for every object: fullnameOverride, else "<release>" when the
release name already contains the chart name, else "<release>-<chart>".
*/}}
{{- define "lorenz.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A name with a suffix ("<fullname>-<suffix>"): the fullname is cut first so that the suffix
always survives the 63-character limit. NB: a suffix of 62 characters or more (a long namespace)
still keeps one character of the fullname; only cluster-scoped RBAC names take such suffixes,
and those may be up to 253 characters long.
*/}}
{{- define "lorenz.suffixedName" -}}
{{- $suffix := .suffix }}
{{- $budget := max 1 (sub 62 (len $suffix)) | int }}
{{- printf "%s-%s" (include "lorenz.fullname" .context | trunc $budget | trimSuffix "-") $suffix }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label (a "+" is not allowed in label values). */}}
{{- define "lorenz.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods; they never change across upgrades. */}}
{{- define "lorenz.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lorenz.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels, on every object the chart creates. */}}
{{- define "lorenz.labels" -}}
helm.sh/chart: {{ include "lorenz.chart" . }}
{{ include "lorenz.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: lorenz
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the operator runs as (created by the chart or brought by the user). */}}
{{- define "lorenz.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lorenz.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository:tag (tag defaults to appVersion), or repository@digest. */}}
{{- define "lorenz.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The PVC that holds the workspaces: the user's existing claim or the chart's own. */}}
{{- define "lorenz.workspacesClaimName" -}}
{{- if .Values.workspaces.persistence.existingClaim }}
{{- .Values.workspaces.persistence.existingClaim }}
{{- else }}
{{- include "lorenz.suffixedName" (dict "context" . "suffix" "workspaces") }}
{{- end }}
{{- end }}
