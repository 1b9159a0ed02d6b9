{{/*
The operator's permissions, one rule per purpose. tests/e2e/test_chart_rbac.py takes each verb
away in turn and shows which part of the operator breaks, so no rule here is dead.
*/}}

{{- define "rljob.jobRules" -}}
# Watch and read RLTrainingJobs: kopf's watch stream, each reconcile's read, the resync's list.
- apiGroups: [rljob.dev]
  resources: [rltrainingjobs]
  verbs: [get, list, watch]
# Write the operator's part of the status. `get` too: the runtime's Role grants get on its own
# job's status, and RBAC lets the operator grant only what it holds.
- apiGroups: [rljob.dev]
  resources: [rltrainingjobs/status]
  verbs: [get, patch]
# Children carry owner references with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only with this.
- apiGroups: [rljob.dev]
  resources: [rltrainingjobs/finalizers]
  verbs: [update]
# The RayJob each job runs on: server-side applied (create, patch), read, watched, listed for quota;
# deleted when the job restarts after a retriable failure (a new RayJob resumes from the checkpoint).
- apiGroups: [ray.io]
  resources: [rayjobs]
  verbs: [get, list, watch, create, patch, delete]
# The runtime's own identity per job: a ServiceAccount, a Role and a RoleBinding.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch]
# Job pods: watched (a pod change triggers a reconcile), listed for quota use and start-up errors.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# One NetworkPolicy per job (jobPods.networkPolicy): server-side applied.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch]
# GPU quotas: watched to admit queued jobs when room frees up, listed for the quota decision.
- apiGroups: [""]
  resources: [resourcequotas]
  verbs: [list, watch]
# The claims a job mounts (checkpoints, model cache, volumes) must exist before it starts.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Events on jobs: phase changes, refusals, denied permissions (create); at start, the operator's own
# events on jobs, to announce a phase change its predecessor wrote but did not announce (list).
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
{{- end -}}

{{- define "rljob.clusterRules" -}}
# The GPU pre-flight: does any node offer the GPUs each worker pod asks for? (read from a watch cache)
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
{{- end -}}

{{- define "rljob.secretRules" -}}
# operator.secretPreflight: referenced Secrets must exist before anything is created.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end -}}


{{- define "rljob.leaseRules" -}}
# Leader election (leaderElection.enabled): the replicas' Lease, created by the first one, then read
# and renewed under its name only (RBAC cannot limit create to a name).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "rljob.leaseName" . }}]
  verbs: [get, update]
{{- end -}}
