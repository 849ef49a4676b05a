{{/*
Names. The full name is cut to 40 characters so that "<full>-etcd-headless" and the
StatefulSets' "<name>-<revision hash>" labels stay within Kubernetes' 63.
*/}}
{{- define "etcd-elastic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "etcd-elastic.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "etcd-elastic.workersName" -}}
{{- printf "%s-workers" (include "etcd-elastic.fullname" .) }}
{{- end }}

{{- define "etcd-elastic.etcdName" -}}
{{- printf "%s-etcd" (include "etcd-elastic.fullname" .) }}
{{- end }}

{{/* The etcd client Service (ClusterIP) and the members' headless Service. */}}
{{- define "etcd-elastic.etcdClientService" -}}
{{- include "etcd-elastic.etcdName" . }}
{{- end }}

{{- define "etcd-elastic.etcdHeadlessService" -}}
{{- printf "%s-headless" (include "etcd-elastic.etcdName" .) }}
{{- end }}

{{- define "etcd-elastic.scriptsName" -}}
{{- printf "%s-scripts" (include "etcd-elastic.fullname" .) }}
{{- end }}

{{- define "etcd-elastic.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "etcd-elastic.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "etcd-elastic.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; selector labels are the stable subset. */}}
{{- define "etcd-elastic.labels" -}}
helm.sh/chart: {{ include "etcd-elastic.chart" . }}
{{ include "etcd-elastic.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: etcd-elastic
{{- end }}

{{- define "etcd-elastic.selectorLabels" -}}
app.kubernetes.io/name: {{ include "etcd-elastic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Component selector labels: (dict "root" $ "component" "worker") */}}
{{- define "etcd-elastic.componentSelectorLabels" -}}
{{ include "etcd-elastic.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "etcd-elastic.componentLabels" -}}
{{ include "etcd-elastic.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The components allowed to the etcd client port by the NetworkPolicy. */}}
{{- define "etcd-elastic.etcdClientComponents" -}}
{{- list "worker" "etcd-test" "etcd-auth-setup" | toJson }}
{{- end }}

{{/*
The install's nonce: drawn once per install (six lowercase letters and digits), kept by every
upgrade, read back from the worker StatefulSet's annotation (lookup; helm template and a
client-side --dry-run cannot look, so they draw a new one). Memoised in .Values so that every
template of one render uses the same one.
*/}}
{{- define "etcd-elastic.runNonce" -}}
{{- if not (hasKey .Values "etcdElasticRunNonce") }}
{{- $nonce := "" }}
{{- $workers := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "etcd-elastic.workersName" .) }}
{{- if $workers }}
{{- $nonce = index ($workers.metadata.annotations | default dict) "etcd-elastic/run-nonce" | default "" }}
{{- end }}
{{- $_ := set .Values "etcdElasticRunNonce" ($nonce | default (randAlphaNum 6 | lower)) }}
{{- end }}
{{- index .Values "etcdElasticRunNonce" }}
{{- end }}

{{/*
The run id: job.runId, else "<namespace>-<release>-<nonce>", new with every install (a
reinstall under the same release name runs a new job, not the finished one's id) and kept by
upgrades.
*/}}
{{- define "etcd-elastic.runId" -}}
{{- default (printf "%s-%s-%s" .Release.Namespace .Release.Name (include "etcd-elastic.runNonce" .)) .Values.job.runId }}
{{- end }}

{{/*
The rendezvous namespace's key prefix with its "/" (default /elastic/): every key the agents
touch is under <prefix><run id>/, so the auth setup Job grants the job's etcd user this and
nothing else (docs/security.md).
*/}}
{{- define "etcd-elastic.keyPrefix" -}}
{{- printf "%s/" (trimSuffix "/" (default "/elastic" .Values.workers.rdzvConf.namespace)) }}
{{- end }}

{{- define "etcd-elastic.workerImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "etcd-elastic.etcdImage" -}}
{{- printf "%s:%s" .Values.etcd.image.repository .Values.etcd.image.tag }}
{{- end }}

{{- define "etcd-elastic.bundledEtcd" -}}
{{- if not .Values.etcd.external.endpoints }}true{{ end }}
{{- end }}

{{- define "etcd-elastic.scheme" -}}
{{- if .Values.etcd.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* "<svc>.<namespace>.svc.<clusterDomain>" */}}
{{- define "etcd-elastic.serviceHost" -}}
{{- printf "%s.%s.svc.%s" .service .root.Release.Namespace .root.Values.clusterDomain }}
{{- end }}

{{/* A member's peer/client host: "<pod>.<headless>.<namespace>.svc.<clusterDomain>" */}}
{{- define "etcd-elastic.memberHost" -}}
{{- printf "%s-%d.%s" (include "etcd-elastic.etcdName" .root) (int .ordinal) (include "etcd-elastic.serviceHost" (dict "root" .root "service" (include "etcd-elastic.etcdHeadlessService" .root))) }}
{{- end }}

{{/* --initial-cluster: every member by name and peer URL. */}}
{{- define "etcd-elastic.initialCluster" -}}
{{- $members := list }}
{{- range $ordinal := until (int .Values.etcd.replicas) }}
{{- $host := include "etcd-elastic.memberHost" (dict "root" $ "ordinal" $ordinal) }}
{{- $members = append $members (printf "%s-%d=%s://%s:2380" (include "etcd-elastic.etcdName" $) $ordinal (include "etcd-elastic.scheme" $) $host) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/*
The etcd endpoints the clients (workers, test, setup) use, comma-separated: the client Service
when bundled, the external endpoints otherwise. Under TLS, endpoints without a scheme get
https:// (etcdctl needs it); without TLS they are left as they are.
*/}}
{{- define "etcd-elastic.clientEndpoints" -}}
{{- $endpoints := list }}
{{- if include "etcd-elastic.bundledEtcd" . }}
{{- $endpoints = list (printf "%s:2379" (include "etcd-elastic.serviceHost" (dict "root" . "service" (include "etcd-elastic.etcdClientService" .)))) }}
{{- else }}
{{- $endpoints = .Values.etcd.external.endpoints }}
{{- end }}
{{- $rendered := list }}
{{- range $endpoints }}
{{- if and $.Values.etcd.tls.enabled (not (contains "://" .)) }}
{{- $rendered = append $rendered (printf "https://%s" .) }}
{{- else }}
{{- $rendered = append $rendered . }}
{{- end }}
{{- end }}
{{- join "," $rendered }}
{{- end }}

{{/* Where the client side finds its TLS files and the password (mount paths). */}}
{{- define "etcd-elastic.clientTlsDir" -}}/etc/etcd-elastic/etcd-tls{{- end }}
{{- define "etcd-elastic.authDir" -}}/etc/etcd-elastic/etcd-auth{{- end }}
{{- define "etcd-elastic.scriptsDir" -}}/opt/etcd-elastic-chart{{- end }}

{{/*
The connection part of --rdzv-conf (TLS files, user, password file), as K=V,... or empty.
elasticrun and the wait-for-etcd init container use the same string.
*/}}
{{- define "etcd-elastic.connectionConf" -}}
{{- $conf := list }}
{{- if .Values.etcd.tls.enabled }}
{{- $dir := include "etcd-elastic.clientTlsDir" . }}
{{- $conf = append $conf (printf "cacert=%s/ca.crt" $dir) }}
{{- if .Values.etcd.tls.clientCertAuth }}
{{- $conf = append $conf (printf "cert=%s/tls.crt" $dir) }}
{{- $conf = append $conf (printf "key=%s/tls.key" $dir) }}
{{- end }}
{{- end }}
{{- if .Values.etcd.auth.enabled }}
{{- $conf = append $conf (printf "user=%s" .Values.etcd.auth.user) }}
{{- $conf = append $conf (printf "password_file=%s/%s" (include "etcd-elastic.authDir" .) .Values.etcd.auth.passwordKey) }}
{{- end }}
{{- join "," $conf }}
{{- end }}

{{/*
The engine part of --rdzv-conf from workers.rdzvConf (null keys left out), or empty. With the
install's own run id, also already_finished_ok=1: that id can only have finished in this
install, so a pod recreated after the end (a drain) idles like the others instead of exiting 3.
*/}}
{{- define "etcd-elastic.engineConf" -}}
{{- $conf := list }}
{{- range $key, $value := .Values.workers.rdzvConf }}
{{- if not (kindIs "invalid" $value) }}
{{- $conf = append $conf (printf "%s=%v" $key $value) }}
{{- end }}
{{- end }}
{{- if not .Values.job.runId }}
{{- $conf = append $conf "already_finished_ok=1" }}
{{- end }}
{{- join "," $conf }}
{{- end }}

{{- define "etcd-elastic.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.workers.terminationGracePeriodSeconds }}
{{- add (int .Values.workers.shutdownTimeout) 30 }}
{{- else }}
{{- int .Values.workers.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* elasticrun's arguments, as a JSON list (the training command comes after "--"). */}}
{{- define "etcd-elastic.workerArgs" -}}
{{- $args := list }}
{{- $args = append $args (printf "--nnodes=%d:%d" (int .Values.nnodes.min) (int .Values.nnodes.max)) }}
{{- $args = append $args (printf "--nproc-per-node=%v" .Values.workers.nprocPerNode) }}
{{- $args = append $args "--rdzv-backend=etcd" }}
{{- $args = append $args (printf "--rdzv-endpoint=%s" (include "etcd-elastic.clientEndpoints" .)) }}
{{- $args = append $args (printf "--rdzv-id=%s" (include "etcd-elastic.runId" .)) }}
{{- with include "etcd-elastic.engineConf" . }}
{{- $args = append $args (printf "--rdzv-conf=%s" .) }}
{{- end }}
{{- with include "etcd-elastic.connectionConf" . }}
{{- $args = append $args (printf "--rdzv-conf=%s" .) }}
{{- end }}
{{- $args = append $args (printf "--max-restarts=%d" (int .Values.workers.maxRestarts)) }}
{{- $args = append $args (printf "--shutdown-timeout=%d" (int .Values.workers.shutdownTimeout)) }}
{{- $args = append $args (printf "--exit-barrier-timeout=%d" (int .Values.workers.exitBarrierTimeout)) }}
{{- $args = append $args "--local-addr=$(POD_IP)" }}
{{- if .Values.workers.metrics.enabled }}
{{- $args = append $args (printf "--metrics-port=%d" (int .Values.workers.metrics.port)) }}
{{- $args = append $args "--metrics-addr=0.0.0.0" }}
{{- end }}
{{- range .Values.workers.extraArgs }}
{{- $args = append $args . }}
{{- end }}
{{- if .Values.job.module }}
{{- $args = append $args "--module" }}
{{- end }}
{{- if .Values.job.noPython }}
{{- $args = append $args "--no-python" }}
{{- end }}
{{- $args = append $args "--" }}
{{- range .Values.job.command }}
{{- $args = append $args . }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/*
Checks JSON schema cannot express (it compares no two fields); each failure names the values
to change. Included by the worker StatefulSet, which every render produces.
*/}}
{{- define "etcd-elastic.validate" -}}
{{- $min := int .Values.nnodes.min }}
{{- $max := int .Values.nnodes.max }}
{{- if gt $min $max }}
{{- fail (printf "nnodes.min (%d) must not exceed nnodes.max (%d)." $min $max) }}
{{- end }}
{{- $replicas := int .Values.workers.replicas }}
{{- if or (lt $replicas $min) (gt $replicas $max) }}
{{- fail (printf "workers.replicas (%d) must be between nnodes.min (%d) and nnodes.max (%d)." $replicas $min $max) }}
{{- end }}
{{- if not (kindIs "invalid" .Values.workers.terminationGracePeriodSeconds) }}
{{- if le (int .Values.workers.terminationGracePeriodSeconds) (int .Values.workers.shutdownTimeout) }}
{{- fail (printf "workers.terminationGracePeriodSeconds (%d) must exceed workers.shutdownTimeout (%d), or the agent is killed before it stops its workers; leave it null for shutdownTimeout + 30." (int .Values.workers.terminationGracePeriodSeconds) (int .Values.workers.shutdownTimeout)) }}
{{- end }}
{{- end }}
{{- if and .Values.job.module .Values.job.noPython }}
{{- fail "job.module and job.noPython cannot both be true." }}
{{- end }}
{{- if and .Values.workers.metrics.serviceMonitor.enabled (not .Values.workers.metrics.enabled) }}
{{- fail "workers.metrics.serviceMonitor.enabled needs workers.metrics.enabled: true (the agents serve /metrics only then)." }}
{{- end }}
{{- if .Values.etcd.tls.enabled }}
{{- if not .Values.etcd.tls.clientSecretName }}
{{- fail "etcd.tls.enabled needs etcd.tls.clientSecretName: a Secret with ca.crt (and tls.crt/tls.key for client certificate auth) for the workers." }}
{{- end }}
{{- if and (include "etcd-elastic.bundledEtcd" .) (not .Values.etcd.tls.serverSecretName) }}
{{- fail "etcd.tls.enabled with the bundled etcd needs etcd.tls.serverSecretName: a Secret with ca.crt, tls.crt and tls.key for the members." }}
{{- end }}
{{- end }}
{{- range .Values.etcd.external.endpoints }}
{{- if and $.Values.etcd.tls.enabled (hasPrefix "http://" .) }}
{{- fail (printf "etcd.external.endpoints: %s is http:// but etcd.tls.enabled is true; use https:// or no scheme." .) }}
{{- end }}
{{- if and (not $.Values.etcd.tls.enabled) (hasPrefix "https://" .) }}
{{- fail (printf "etcd.external.endpoints: %s is https:// but etcd.tls.enabled is false; enable etcd.tls (with clientSecretName holding the CA)." .) }}
{{- end }}
{{- end }}
{{- if and .Values.etcd.auth.enabled (not .Values.etcd.auth.existingSecret) }}
{{- fail (printf "etcd.auth.enabled needs etcd.auth.existingSecret: a Secret with the keys %s%s." .Values.etcd.auth.passwordKey (ternary (printf " and %s" .Values.etcd.auth.rootPasswordKey) "" (eq (include "etcd-elastic.bundledEtcd" .) "true"))) }}
{{- end }}
{{- end }}

{{/* Volumes of a pod that talks to etcd: the scripts, and the TLS and password Secrets. */}}
{{- define "etcd-elastic.clientVolumes" -}}
- name: scripts
  configMap:
    name: {{ include "etcd-elastic.scriptsName" . }}
{{- if .Values.etcd.tls.enabled }}
- name: etcd-client-tls
  secret:
    secretName: {{ .Values.etcd.tls.clientSecretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.etcd.auth.enabled }}
- name: etcd-auth
  secret:
    secretName: {{ .Values.etcd.auth.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.etcd.auth.passwordKey }}
        path: {{ .Values.etcd.auth.passwordKey }}
{{- end }}
{{- end }}

{{- define "etcd-elastic.clientVolumeMounts" -}}
- name: scripts
  mountPath: {{ include "etcd-elastic.scriptsDir" . }}
  readOnly: true
{{- if .Values.etcd.tls.enabled }}
- name: etcd-client-tls
  mountPath: {{ include "etcd-elastic.clientTlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.etcd.auth.enabled }}
- name: etcd-auth
  mountPath: {{ include "etcd-elastic.authDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* imagePullSecrets from names or {name: ...} objects; nothing when there are none. */}}
{{- define "etcd-elastic.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
