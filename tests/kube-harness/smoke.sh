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
