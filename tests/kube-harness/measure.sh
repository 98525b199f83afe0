#!/usr/bin/env bash
# measure.sh: startup time and memory of kube-harness with 1 and 3 API servers.
#
#   tests/kube-harness/measure.sh            # plain API servers
#   CRDS=1 tests/kube-harness/measure.sh     # each with the Kamaji + Slinky CRDs
#
# For each API server: the wall time of its POST /apiservers (until ready).
# After 1 and after 3 API servers, and a settle time (SETTLE, default 20s):
# the process RSS (from /proc, via GET /stats), Go heap and goroutines.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shared="${PADDOCK_SHARED:-$(cd "$here/../../.." && pwd)/shared}"
settle="${SETTLE:-20}"
bin="$("$here/build.sh")"
work="$(mktemp -d /tmp/kube-harness-measure.XXXXXX)"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

body='{"name": "%s"}'
if [[ "${CRDS:-}" == 1 ]]; then
  list="$(printf '"%s",' "$shared"/crds/kamaji/*.yaml "$shared"/crds/slinky/*.yaml)"
  body="{\"name\": \"%s\", \"crds\": [${list%,}]}"
fi

"$bin" --dir "$work/data" >"$work/stdout" 2>"$work/stderr" &
pid=$!
for _ in $(seq 600); do grep -qx READY "$work/stdout" 2>/dev/null && break; sleep 0.1; done
ctl="http://$(sed -n 's/^CONTROL_ADDR=//p' "$work/stdout")"

report() {
  curl -sf "$ctl/stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print("apiservers=%d rss_mib=%d heap_alloc_mib=%d goroutines=%d" % (
    s["apiservers"], s["rss_bytes"] >> 20, s["heap_alloc_bytes"] >> 20, s["goroutines"]))'
}

echo "harness only: $(report)"
for n in 1 2 3; do
  t="$(curl -sf -o /dev/null -w '%{time_total}' -X POST "$ctl/apiservers" -d "$(printf "$body" "m$n")")"
  echo "POST /apiservers m$n: ${t}s"
  if [[ $n == 1 || $n == 3 ]]; then
    sleep "$settle"
    echo "after ${settle}s: $(report)"
  fi
done
