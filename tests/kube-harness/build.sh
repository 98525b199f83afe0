#!/usr/bin/env bash
# build.sh: build the kube-harness binary (if needed) and print its path.
#
#   BIN=$(tests/kube-harness/build.sh)
#
# The binary goes to ${PADDOCK_KUBE_HARNESS_BIN:-$HOME/.cache/paddock/kube-harness/kube-harness}
# so CI can cache it. A stamp file next to it (<bin>.stamp) holds a hash of
# everything the build depends on (go.mod, go.sum, *.go, this script, the Go
# version); when it matches, nothing is rebuilt. Only the path goes to stdout;
# progress goes to stderr.
#
# Environment: PADDOCK_KUBE_HARNESS_BIN (output path), GO (go binary; default:
# `go` on PATH, else /usr/local/go/bin/go). Go's own GOCACHE/GOMODCACHE/GOPROXY
# apply as usual; modules come from the Go module proxy on the first build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${PADDOCK_KUBE_HARNESS_BIN:-$HOME/.cache/paddock/kube-harness/kube-harness}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
mkdir -p "$(dirname "$bin")"

# The Kubernetes release we embed, for `kubectl version` / GET /version
# (without it the API server reports v0.0.0-master).
k8s_version="$(awk '$1=="require" {$1=""; $0=$0} $1=="k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")"
[[ "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || { echo "build.sh: cannot find k8s.io/kubernetes in go.mod" >&2; exit 1; }
pkg=k8s.io/component-base/version
# -s -w: no symbol table / DWARF (binary 149 MB -> 105 MB); panics still show stacks.
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]} -X $pkg.gitTreeState=clean"

stamp() {
  (
    cd "$here"
    "$GO" version
    echo "$ldflags"
    sha256sum go.mod go.sum build.sh ./*.go
  ) | sha256sum | cut -d' ' -f1
}

# One build at a time per output path (parallel test jobs may all call us).
exec 9>"$bin.lock"
flock 9

want="$(stamp)"
if [[ -x "$bin" && -f "$bin.stamp" && "$(cat "$bin.stamp")" == "$want" ]]; then
  echo "$bin"
  exit 0
fi

echo "build.sh: building kube-harness (k8s.io/kubernetes $k8s_version) -> $bin" >&2
start=$(date +%s)
tmp="$bin.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# -trimpath and CGO_ENABLED=0 as in images/node/build-kubelet: the packages both binaries share
# (client-go, apimachinery, most of k8s.io/kubernetes) then compile once into Go's build cache.
(cd "$here" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp" .)
mv -f "$tmp" "$bin"
echo "$want" >"$bin.stamp"
echo "build.sh: built in $(($(date +%s) - start))s" >&2
echo "$bin"
