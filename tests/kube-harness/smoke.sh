#!/usr/bin/env bash
# smoke.sh: end-to-end check of kube-harness with curl only (no kubectl).
#
# Builds the harness (build.sh), starts it, creates two API servers and checks:
#   - they are isolated (a namespace created in one is absent in the other,
#     and one's admin token is rejected by the other);
#   - namespace deletion really finishes (namespace controller);
#   - the "default" ServiceAccount appears, TokenRequest works, and RBAC
#     applies to the service-account token (403, then 200 once bound);
#   - a privileged pod is accepted (--allow-privileged, process-wide);
#   - garbage collection of an owned object; ResourceQuota usage and enforcement;
#   - the real Kamaji and Slinky CRDs (spec.conversion and the cert-manager
#     annotation dropped by the harness) are Established and a minimal
#     TenantControlPlane is validated, defaulted, stored and its status
#     subresource written;
#   - opt-in "workloads" controllers on a third API server: Deployment -> ReplicaSet -> pods,
#     StatefulSet -> pod-0, DaemonSet -> a pod per eligible Node, Job -> pod, Service ->
#     EndpointSlice and Endpoints, PVC bound to its PV, and the real kube-scheduler binding pods
#     only to Nodes that match their nodeSelector (and leaving the others Unschedulable);
#   - deleting an API server, then stopping the whole process.
# Prints "smoke: N passed, 0 failed" and exits 0 on success.
#
# Needs: bash, curl, python3 (JSON parsing), Go for the build.
# Env: PADDOCK_SHARED (default: ../../../shared from here, i.e. /work/shared),
#      KEEP=1 keeps the data directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shared="${PADDOCK_SHARED:-$(cd "$here/../../.." && pwd)/shared}"
kamaji_crds=("$shared"/crds/kamaji/*.yaml)
slinky_crds=("$shared"/crds/slinky/*.yaml)

# since T: seconds elapsed since T (a `date +%s.%N` value), one decimal.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

passed=0
failed=0
log() { echo "smoke: $*"; }
ok() { passed=$((passed + 1)); log "ok   - $*"; }
fail() { failed=$((failed + 1)); log "FAIL - $*"; }
check() { # check "description" command...
  local what="$1"; shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
# json FIELD_PATH: read JSON on stdin and print a field, e.g. json spec.conversion.strategy
json() {
  python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split(".") if sys.argv[1] else []:
    v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
' "$1"
}

bin="$("$here/build.sh")"
work="$(mktemp -d /tmp/kube-harness-smoke.XXXXXX)"
harness_pid=""
cleanup() {
  if [[ -n "$harness_pid" ]] && kill -0 "$harness_pid" 2>/dev/null; then
    kill -TERM "$harness_pid" 2>/dev/null || true
    wait "$harness_pid" 2>/dev/null || true
  fi
  if [[ "${KEEP:-}" == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- start the harness -------------------------------------------------------
t0=$(date +%s.%N)
"$bin" --dir "$work/data" >"$work/stdout" 2>"$work/stderr" &
harness_pid=$!
for _ in $(seq 600); do
  grep -qx READY "$work/stdout" 2>/dev/null && break
  kill -0 "$harness_pid" 2>/dev/null || { cat "$work/stderr" >&2; log "harness died"; exit 1; }
  sleep 0.1
done
grep -qx READY "$work/stdout" || { log "harness not READY after 60s"; exit 1; }
ctl="http://$(sed -n 's/^CONTROL_ADDR=//p' "$work/stdout")"
log "harness pid $harness_pid, control endpoint $ctl, ready after $(since "$t0")s"
check "GET /healthz" test "$(curl -sf "$ctl/healthz")" = ok

# --- two API servers ---------------------------------------------------------
crd_list="$(printf '"%s",' "${kamaji_crds[@]}" "${slinky_crds[@]}")"
curl -sf -X POST "$ctl/apiservers" -d "{\"name\": \"platform\", \"crds\": [${crd_list%,}]}" >"$work/platform.json" ||
  { log "creating platform failed"; tail -50 "$work/stderr"; exit 1; }
curl -sf -X POST "$ctl/apiservers" -d '{"name": "tenant"}' >"$work/tenant.json" ||
  { log "creating tenant failed"; tail -50 "$work/stderr"; exit 1; }
log "platform: $(json url <"$work/platform.json"), ready in $(json startup_seconds <"$work/platform.json")s (incl. 8 CRDs)"
log "tenant:   $(json url <"$work/tenant.json"), ready in $(json startup_seconds <"$work/tenant.json")s"
check "GET /apiservers lists both" test "$(curl -sf "$ctl/apiservers" | json apiservers | python3 -c 'import json,sys; print(",".join(a["name"] for a in json.load(sys.stdin)))')" = platform,tenant
check "duplicate name is a 409" test "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$ctl/apiservers" -d '{"name": "tenant"}')" = 409

# Per API server: URL, token, CA file, read from the harness's answer.
declare -A URL TOKEN CA
for s in platform tenant; do
  URL[$s]="$(json url <"$work/$s.json")"
  TOKEN[$s]="$(json token <"$work/$s.json")"
  CA[$s]="$(json ca_file <"$work/$s.json")"
  check "$s kubeconfig written" grep -q "server: ${URL[$s]}" "$(json kubeconfig <"$work/$s.json")"
done
# k SERVER METHOD PATH [JSON-BODY] [TOKEN]: prints the body, then the HTTP status on the last line.
k() {
  local s="$1" method="$2" path="$3" body="${4:-}" token="${5:-${TOKEN[$1]}}"
  local args=(-s --cacert "${CA[$s]}" -H "Authorization: Bearer $token" -X "$method" -w '\n%{http_code}')
  if [[ -n "$body" ]]; then
    local ctype=application/json
    [[ "$method" == PATCH ]] && ctype=application/merge-patch+json
    args+=(-H "Content-Type: $ctype" -d "$body")
  fi
  curl "${args[@]}" "${URL[$s]}$path"
}
status() { k "$@" | tail -n1; } # just the HTTP status
body() { k "$@" | sed '$d'; }   # just the body

check "platform /readyz with the admin token" test "$(status platform GET /readyz)" = 200
check "GET /version reports v1.35" test "$(body platform GET /version | json gitVersion | cut -d. -f1,2)" = v1.35

# --- isolation -----------------------------------------------------------------
check "create namespace only-in-platform in platform" test "$(status platform POST /api/v1/namespaces '{"metadata":{"name":"only-in-platform"}}')" = 201
check "namespace only-in-platform exists in platform" test "$(status platform GET /api/v1/namespaces/only-in-platform)" = 200
check "namespace only-in-platform is absent in tenant" test "$(status tenant GET /api/v1/namespaces/only-in-platform)" = 404
check "platform's admin token is rejected by tenant (401)" test "$(status tenant GET /api/v1/namespaces "" "${TOKEN[platform]}")" = 401
check "anonymous may not list namespaces (403)" test "$(curl -s -o /dev/null -w '%{http_code}' --cacert "${CA[platform]}" "${URL[platform]}/api/v1/namespaces")" = 403

# --- service accounts, TokenRequest, RBAC --------------------------------------
wait_for() { # wait_for SECONDS command... : retry every 0.2s
  local deadline=$(($(date +%s) + $1)); shift
  until "$@"; do (($(date +%s) < deadline)) || return 1; sleep 0.2; done
}
sa_exists() { test "$(status tenant GET /api/v1/namespaces/work/serviceaccounts/default)" = 200; }
check "create namespace work in tenant" test "$(status tenant POST /api/v1/namespaces '{"metadata":{"name":"work"}}')" = 201
check "serviceaccount controller creates work/default" wait_for 30 sa_exists
root_ca() { test "$(status tenant GET /api/v1/namespaces/work/configmaps/kube-root-ca.crt)" = 200; }
check "root-ca-cert-publisher creates work/kube-root-ca.crt" wait_for 30 root_ca
sa_token="$(body tenant POST /api/v1/namespaces/work/serviceaccounts/default/token '{"spec":{"expirationSeconds":600}}' | json status.token)"
check "TokenRequest returns a token" test -n "$sa_token"
whoami="$(body tenant POST /apis/authentication.k8s.io/v1/selfsubjectreviews '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' "$sa_token" | json status.userInfo.username)"
check "the token authenticates as system:serviceaccount:work:default" test "$whoami" = system:serviceaccount:work:default
check "RBAC: the service account may not list namespaces (403)" test "$(status tenant GET /api/v1/namespaces "" "$sa_token")" = 403
check "bind it to cluster-admin" test "$(status tenant POST /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{"metadata":{"name":"work-admin"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"cluster-admin"},"subjects":[{"kind":"ServiceAccount","name":"default","namespace":"work"}]}')" = 201
can_list() { test "$(status tenant GET /api/v1/namespaces "" "$sa_token")" = 200; }
check "RBAC: now it may (200)" wait_for 10 can_list
# --allow-privileged is process-wide (main.go): calico-node's kind of pod is accepted.
priv='{"metadata":{"name":"privileged"},"spec":{"hostNetwork":true,"containers":[{"name":"c","image":"calico/node","securityContext":{"privileged":true}}]}}'
check "a privileged hostNetwork pod is accepted (201)" test "$(status tenant POST /api/v1/namespaces/work/pods "$priv")" = 201
check "the tenant token is rejected by platform (401)" test "$(status platform GET /api/v1/namespaces "" "$sa_token")" = 401

# --- garbage collector --------------------------------------------------------
owner_uid="$(body tenant POST /api/v1/namespaces/work/configmaps '{"metadata":{"name":"owner"}}' | json metadata.uid)"
check "create an owned ConfigMap" test "$(status tenant POST /api/v1/namespaces/work/configmaps "{\"metadata\":{\"name\":\"owned\",\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"owner\",\"uid\":\"$owner_uid\"}]}}")" = 201
check "delete its owner" test "$(status tenant DELETE /api/v1/namespaces/work/configmaps/owner)" = 200
owned_gone() { test "$(status tenant GET /api/v1/namespaces/work/configmaps/owned)" = 404; }
t=$(date +%s.%N)
check "garbage collector deletes the owned ConfigMap" wait_for 60 owned_gone
log "  (GC took $(since "$t")s)"

# --- resource quota ---------------------------------------------------------------
check "create namespace quota in tenant" test "$(status tenant POST /api/v1/namespaces '{"metadata":{"name":"quota"}}')" = 201
q_root_ca() { test "$(status tenant GET /api/v1/namespaces/quota/configmaps/kube-root-ca.crt)" = 200; }
check "kube-root-ca.crt published in quota" wait_for 30 q_root_ca
check "create ResourceQuota configmaps=2" test "$(status tenant POST /api/v1/namespaces/quota/resourcequotas '{"metadata":{"name":"q"},"spec":{"hard":{"configmaps":"2"}}}')" = 201
q_used() { test "$(body tenant GET /api/v1/namespaces/quota/resourcequotas/q | json status.used.configmaps)" = 1; }
check "resourcequota controller computes status.used.configmaps=1" wait_for 30 q_used
check "a 2nd ConfigMap fits the quota (201)" test "$(status tenant POST /api/v1/namespaces/quota/configmaps '{"metadata":{"name":"a"}}')" = 201
check "a 3rd ConfigMap exceeds it (403)" test "$(status tenant POST /api/v1/namespaces/quota/configmaps '{"metadata":{"name":"b"}}')" = 403

# --- namespace deletion finishes ----------------------------------------------
check "create namespace doomed in tenant" test "$(status tenant POST /api/v1/namespaces '{"metadata":{"name":"doomed"}}')" = 201
check "put a Secret in it" test "$(status tenant POST /api/v1/namespaces/doomed/secrets '{"metadata":{"name":"s"},"stringData":{"k":"v"}}')" = 201
check "delete namespace doomed" test "$(status tenant DELETE /api/v1/namespaces/doomed)" = 200
ns_gone() { test "$(status tenant GET /api/v1/namespaces/doomed)" = 404; }
t=$(date +%s.%N)
check "namespace doomed is really gone (404)" wait_for 60 ns_gone
log "  (namespace deletion took $(since "$t")s; the real controller waits 5s first)"

# --- Kamaji and Slinky CRDs ------------------------------------------------------
tcp_crd=/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tenantcontrolplanes.kamaji.clastix.io
check "harness reported 8 installed CRDs" test "$(json crds <"$work/platform.json" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 8
check "TCP CRD is Established" test "$(body platform GET $tcp_crd | python3 -c 'import json,sys; print([c["status"] for c in json.load(sys.stdin)["status"]["conditions"] if c["type"]=="Established"][0])')" = True
check "TCP CRD has no webhook conversion" test "$(body platform GET $tcp_crd | json spec.conversion.strategy)" = None
check "TCP CRD has no cert-manager annotation" test -z "$(body platform GET $tcp_crd | json metadata.annotations | grep cert-manager || true)"
check "slinky.slurm.net/v1beta1 serves 6 resources" test "$(body platform GET /apis/slinky.slurm.net/v1beta1 | python3 -c 'import json,sys; print(len([r for r in json.load(sys.stdin)["resources"] if "/" not in r["name"]]))')" = 6
check "the tenant API server has no Kamaji API (404)" test "$(status tenant GET /apis/kamaji.clastix.io/v1alpha1)" = 404

tcps=/apis/kamaji.clastix.io/v1alpha1/namespaces/only-in-platform/tenantcontrolplanes
bad='{"apiVersion":"kamaji.clastix.io/v1alpha1","kind":"TenantControlPlane","metadata":{"name":"bad"},"spec":{"controlPlane":{"service":{"serviceType":"Bogus"}},"kubernetes":{"version":"v1.35.0","kubelet":{}},"networkProfile":{}}}'
check "schema rejects serviceType Bogus (422)" test "$(status platform POST $tcps "$bad")" = 422
# Without spec.networkProfile the CRD's own CEL rules fail ("no such key: networkProfile").
nonet='{"apiVersion":"kamaji.clastix.io/v1alpha1","kind":"TenantControlPlane","metadata":{"name":"nonet"},"spec":{"controlPlane":{"service":{"serviceType":"ClusterIP"}},"kubernetes":{"version":"v1.35.0","kubelet":{}}}}'
check "CEL rules reject a TCP without spec.networkProfile (422)" test "$(status platform POST $tcps "$nonet")" = 422
tcp='{"apiVersion":"kamaji.clastix.io/v1alpha1","kind":"TenantControlPlane","metadata":{"name":"t1"},"spec":{"controlPlane":{"service":{"serviceType":"ClusterIP"}},"kubernetes":{"version":"v1.35.0","kubelet":{}},"networkProfile":{}}}'
check "create a minimal TenantControlPlane (201)" test "$(status platform POST $tcps "$tcp")" = 201
check "defaults applied (networkProfile.port 6443)" test "$(body platform GET $tcps/t1 | json spec.networkProfile.port)" = 6443
check "status subresource: write status.kubernetesResources.version.status=Ready" test "$(status platform PATCH $tcps/t1/status '{"status":{"kubernetesResources":{"version":{"status":"Ready","version":"v1.35.0"}}}}')" = 200
check "status reads back" test "$(body platform GET $tcps/t1 | json status.kubernetesResources.version.status)" = Ready
check "TCP is absent from the tenant API server" test "$(status tenant GET $tcps/t1)" = 404
check "delete namespace only-in-platform (TCP inside)" test "$(status platform DELETE /api/v1/namespaces/only-in-platform)" = 200
p_ns_gone() { test "$(status platform GET /api/v1/namespaces/only-in-platform)" = 404; }
check "namespace with a TenantControlPlane is really gone" wait_for 60 p_ns_gone

# --- opt-in workload controllers and the real kube-scheduler ---------------------------
check "tenant (no controllers asked) runs only the defaults" test "$(json controllers <"$work/tenant.json")" = '["namespace", "serviceaccount", "serviceaccount-token", "garbagecollector", "root-ca-cert-publisher", "resourcequota"]'
check "an unknown controller is a 400" test "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$ctl/apiservers" -d '{"name": "bad", "controllers": ["defaults", "kubelet"]}')" = 400
curl -sf -X POST "$ctl/apiservers" -d '{"name": "workloads", "controllers": ["defaults", "workloads"]}' >"$work/workloads.json" ||
  { log "creating workloads failed"; tail -50 "$work/stderr"; exit 1; }
log "workloads: $(json url <"$work/workloads.json"), ready in $(json startup_seconds <"$work/workloads.json")s"
check "workloads runs the defaults, the workload controllers and the scheduler" test "$(json controllers <"$work/workloads.json" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 15
URL[workloads]="$(json url <"$work/workloads.json")"
TOKEN[workloads]="$(json token <"$work/workloads.json")"
CA[workloads]="$(json ca_file <"$work/workloads.json")"
# py SERVER PATH EXPR: GET PATH and print the Python expression EXPR over its JSON body `d`.
py() { body "$1" GET "$2" | python3 -c "import json,sys; d=json.load(sys.stdin); print($3)"; }
w() { k workloads "$@"; }
ws() { status workloads "$@"; }

# Nodes as a kubelet would register them. Admission (TaintNodesByCondition) adds the
# node.kubernetes.io/not-ready taint on create; the node-lifecycle controller, which would lift
# it, is not run (it would also mark kubelet-less Nodes NotReady), so the test lifts it.
node() { # node NAME DISK TAINTS-JSON
  local st='{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}],"capacity":{"cpu":"8","memory":"32Gi","pods":"110"},"allocatable":{"cpu":"8","memory":"32Gi","pods":"110"}}'
  ws POST /api/v1/nodes "{\"metadata\":{\"name\":\"$1\",\"labels\":{\"disk\":\"$2\"}},\"status\":$st}" >/dev/null
  ws PATCH "/api/v1/nodes/$1" "{\"spec\":{\"taints\":$3}}"
}
check "create a Node: admission taints it node.kubernetes.io/not-ready" test "$(status workloads POST /api/v1/nodes '{"metadata":{"name":"probe"}}')-$(py workloads /api/v1/nodes/probe '[t["key"] for t in d["spec"]["taints"]]')" = "201-['node.kubernetes.io/not-ready']"
check "delete it" test "$(ws DELETE /api/v1/nodes/probe)" = 200
check "ready Node n-ssd (disk=ssd)" test "$(node n-ssd ssd '[]')" = 200
check "ready Node n-hdd (disk=hdd)" test "$(node n-hdd hdd '[]')" = 200
check "ready Node n-tainted (disk=ssd, tainted dedicated=x:NoSchedule)" test "$(node n-tainted ssd '[{"key":"dedicated","value":"x","effect":"NoSchedule"}]')" = 200
check "create namespace apps" test "$(ws POST /api/v1/namespaces '{"metadata":{"name":"apps"}}')" = 201
apps_sa() { test "$(ws GET /api/v1/namespaces/apps/serviceaccounts/default)" = 200; }
check "apps/default ServiceAccount exists" wait_for 30 apps_sa
pods=/api/v1/namespaces/apps/pods
# pod_nodes SELECTOR: the sorted nodeNames of the pods matching a label selector ("-" if unbound).
pod_nodes() { py workloads "$pods?labelSelector=$1" '",".join(sorted(p["spec"].get("nodeName") or "-" for p in d["items"]))'; }
tmpl() { # tmpl LABEL NODESELECTOR-JSON: a pod template
  echo "{\"metadata\":{\"labels\":{\"app\":\"$1\"}},\"spec\":{\"nodeSelector\":$2,\"containers\":[{\"name\":\"c\",\"image\":\"registry.k8s.io/pause:3.10\"}]}}"
}

# Deployment -> ReplicaSet -> pods, scheduled by the real scheduler onto the only ssd Node
# without a taint.
check "create Deployment web (2 replicas, nodeSelector disk=ssd)" test "$(ws POST /apis/apps/v1/namespaces/apps/deployments "{\"metadata\":{\"name\":\"web\"},\"spec\":{\"replicas\":2,\"selector\":{\"matchLabels\":{\"app\":\"web\"}},\"template\":$(tmpl web '{"disk":"ssd"}')}}")" = 201
web_rs() { test "$(py workloads /apis/apps/v1/namespaces/apps/replicasets '[r["metadata"]["ownerReferences"][0]["name"] for r in d["items"]]')" = "['web']"; }
check "deployment controller creates its ReplicaSet" wait_for 60 web_rs
web_bound() { test "$(pod_nodes app=web)" = n-ssd,n-ssd; }
check "replicaset controller creates 2 pods; the scheduler binds both to n-ssd" wait_for 60 web_bound

# StatefulSet -> pod-0, scheduled onto the hdd Node.
check "create StatefulSet db (nodeSelector disk=hdd)" test "$(ws POST /apis/apps/v1/namespaces/apps/statefulsets "{\"metadata\":{\"name\":\"db\"},\"spec\":{\"replicas\":1,\"serviceName\":\"db\",\"selector\":{\"matchLabels\":{\"app\":\"db\"}},\"template\":$(tmpl db '{"disk":"hdd"}')}}")" = 201
db_0() { test "$(py workloads $pods/db-0 'd["spec"].get("nodeName")')" = n-hdd; }
check "statefulset controller creates db-0; the scheduler binds it to n-hdd" wait_for 60 db_0

# DaemonSet -> one pod per Node it may run on (not the tainted one).
check "create DaemonSet agent" test "$(ws POST /apis/apps/v1/namespaces/apps/daemonsets "{\"metadata\":{\"name\":\"agent\"},\"spec\":{\"selector\":{\"matchLabels\":{\"app\":\"agent\"}},\"template\":$(tmpl agent '{}')}}")" = 201
agent_pods() { test "$(pod_nodes app=agent)" = n-hdd,n-ssd; }
check "daemonset controller: one pod on n-ssd, one on n-hdd, none on n-tainted" wait_for 60 agent_pods
check "the DaemonSet reports 2 desired" test "$(py workloads /apis/apps/v1/namespaces/apps/daemonsets/agent 'd["status"].get("desiredNumberScheduled")')" = 2

# The scheduler never binds to a Node that does not match.
check "create pod lost (nodeSelector disk=nvme, no such Node)" test "$(ws POST $pods '{"metadata":{"name":"lost","labels":{"app":"lost"}},"spec":{"nodeSelector":{"disk":"nvme"},"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}')" = 201
lost() { test "$(py workloads $pods/lost '[(c["status"], c.get("reason")) for c in d["status"].get("conditions", []) if c["type"] == "PodScheduled"]')" = "[('False', 'Unschedulable')]"; }
check "the scheduler reports it Unschedulable" wait_for 60 lost
check "and leaves it unbound" test "$(pod_nodes app=lost)" = -
check "web's pods are still only on n-ssd" test "$(pod_nodes app=web)" = n-ssd,n-ssd

# Job -> pod.
check "create Job once" test "$(ws POST /apis/batch/v1/namespaces/apps/jobs "{\"metadata\":{\"name\":\"once\"},\"spec\":{\"template\":{\"spec\":{\"restartPolicy\":\"Never\",\"containers\":[{\"name\":\"c\",\"image\":\"registry.k8s.io/pause:3.10\"}]}}}}")" = 201
job_pod() { test "$(py workloads "$pods?labelSelector=batch.kubernetes.io/job-name=once" 'len(d["items"])')" = 1; }
check "job controller creates its pod" wait_for 60 job_pod

# Service -> EndpointSlice (and Endpoints) of its ready pods; the test plays web's kubelet.
check "create Service web (selector app=web)" test "$(ws POST /api/v1/namespaces/apps/services '{"metadata":{"name":"web"},"spec":{"selector":{"app":"web"},"ports":[{"port":80}]}}')" = 201
web_pod="$(py workloads "$pods?labelSelector=app=web" 'sorted(p["metadata"]["name"] for p in d["items"])[0]')"
check "kubelet (played): $web_pod Running and Ready at 10.244.0.5" test "$(ws PATCH "$pods/$web_pod/status" '{"status":{"phase":"Running","podIP":"10.244.0.5","podIPs":[{"ip":"10.244.0.5"}],"conditions":[{"type":"Ready","status":"True"}]}}')" = 200
slice() { test "$(py workloads "/apis/discovery.k8s.io/v1/namespaces/apps/endpointslices?labelSelector=kubernetes.io/service-name=web" '[a for s in d["items"] for e in (s.get("endpoints") or []) for a in e["addresses"]]')" = "['10.244.0.5']"; }
check "endpointslice controller: web's slice holds 10.244.0.5" wait_for 60 slice
endpoints() { test "$(py workloads /api/v1/namespaces/apps/endpoints/web '[a["ip"] for s in d.get("subsets") or [] for a in s.get("addresses") or []]')" = "['10.244.0.5']"; }
check "endpoints controller: Endpoints web holds 10.244.0.5" wait_for 60 endpoints

# PersistentVolumeClaim -> bound to the matching PersistentVolume.
check "create PV small (1Gi, class manual)" test "$(ws POST /api/v1/persistentvolumes '{"metadata":{"name":"small"},"spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],"storageClassName":"manual","hostPath":{"path":"/tmp/small"}}}')" = 201
check "create PV other (1Gi, class other)" test "$(ws POST /api/v1/persistentvolumes '{"metadata":{"name":"other"},"spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],"storageClassName":"other","hostPath":{"path":"/tmp/other"}}}')" = 201
check "create PVC data (500Mi, class manual)" test "$(ws POST /api/v1/namespaces/apps/persistentvolumeclaims '{"metadata":{"name":"data"},"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"manual","resources":{"requests":{"storage":"500Mi"}}}}')" = 201
pvc_bound() { test "$(py workloads /api/v1/namespaces/apps/persistentvolumeclaims/data '(d["status"].get("phase"), d["spec"].get("volumeName"))')" = "('Bound', 'small')"; }
check "persistentvolume-binder binds data to small" wait_for 60 pvc_bound
check "PV other stays Available" test "$(py workloads /api/v1/persistentvolumes/other 'd["status"].get("phase")')" = Available

# The default set has no workload controllers: a Deployment in tenant gets no ReplicaSet.
check "tenant: create Deployment idle" test "$(status tenant POST /apis/apps/v1/namespaces/work/deployments "{\"metadata\":{\"name\":\"idle\"},\"spec\":{\"replicas\":1,\"selector\":{\"matchLabels\":{\"app\":\"idle\"}},\"template\":$(tmpl idle '{}')}}")" = 201
sleep 3
check "tenant: no ReplicaSet after 3s (no deployment controller)" test "$(body tenant GET /apis/apps/v1/namespaces/work/replicasets | json items)" = "[]"

stats="$(curl -sf "$ctl/stats")"
log "process with 3 API servers (one with workloads): RSS $(($(json rss_bytes <<<"$stats") / 1048576)) MiB, $(json goroutines <<<"$stats") goroutines"
del="$(curl -sf -X DELETE "$ctl/apiservers/workloads")"
check "DELETE /apiservers/workloads (stops its controllers and scheduler)" test "$(json name <<<"$del")" = workloads
log "  (stopped in $(json stop_seconds <<<"$del")s)"

# --- delete one API server, then stop everything ----------------------------------
stats="$(curl -sf "$ctl/stats")"
log "process with 2 API servers: RSS $(($(json rss_bytes <<<"$stats") / 1048576)) MiB, $(json goroutines <<<"$stats") goroutines"
del="$(curl -sf -X DELETE "$ctl/apiservers/tenant")"
check "DELETE /apiservers/tenant" test "$(json name <<<"$del")" = tenant
log "  (stopped in $(json stop_seconds <<<"$del")s, $(json deleted_etcd_keys <<<"$del") etcd keys deleted)"
check "tenant no longer listed" test "$(curl -sf "$ctl/apiservers" | json apiservers | python3 -c 'import json,sys; print(",".join(a["name"] for a in json.load(sys.stdin)))')" = platform
check "tenant no longer answers" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 --cacert "${CA[platform]}" "${URL[tenant]}/readyz")" = 000
check "platform still ready" test "$(status platform GET /readyz)" = 200

t=$(date +%s.%N)
kill -TERM "$harness_pid"
rc=0
wait "$harness_pid" || rc=$?
harness_pid=""
check "harness exits 0 on SIGTERM" test "$rc" = 0
log "  (stopped in $(since "$t")s)"
check "platform no longer answers" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 --cacert "${CA[platform]}" "${URL[platform]}/readyz")" = 000

log "$passed passed, $failed failed"
[[ $failed == 0 ]]
