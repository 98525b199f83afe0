# Helpers of scripts/vm-start and scripts/vm-stop (sourced, not run).
# shellcheck shell=bash

vm_root=/var/tmp/paddock-vm
vm_uri=qemu:///system
vm_cache=${HOME:-/root}/.cache/paddock/vm
vm_venv=$vm_cache/venv
vm_sushy=2.2.0
vm_here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
vm_constraints=${PADDOCK_REDFISH_EMULATOR_DIR:-$vm_here/../shared/redfish-emulator}/constraints.txt

vm_log() { printf 'vm: %s\n' "$*" >&2; }
vm_die() { vm_log "error: $*"; exit 1; }

vm_free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# vm_alive PIDFILE NAME: the PID in PIDFILE runs and its command line mentions NAME.
vm_alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q -- "$2"
}

# vm_kill PIDFILE NAME: SIGTERM, then SIGKILL after 10 s, if it is still that process.
vm_kill() {
  local pid i
  vm_alive "$1" "$2" || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do vm_alive "$1" "$2" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

# libvirtd and virtlogd: reused when libvirtd answers; otherwise started here, and the first run
# that started them notes it in $vm_root/daemons so that the last vm-stop stops them.
vm_ensure_daemons() {
  # /dev/kvm as Debian's udev rule leaves it (root:kvm 0660; containers without udev have it 0600):
  # otherwise libvirt 9.0 probes QEMU as root (KVM usable) but checks the cache as the QEMU user
  # (KVM not usable), finds its capabilities outdated and probes QEMU again on every domain
  # definition: 30-60 s each here, and the emulator redefines a domain on every media change.
  if [[ -c /dev/kvm && $(stat -c '%G %a' /dev/kvm) != "kvm 660" ]] && getent group kvm >/dev/null; then
    vm_log "giving /dev/kvm Debian's udev permissions (root:kvm 0660)"
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
  fi
  if virsh -q -c "$vm_uri" version >/dev/null 2>&1; then return 0; fi
  mkdir -p "$vm_root"
  if ! vm_alive /run/virtlogd.pid virtlogd; then
    virtlogd -d || vm_die "virtlogd did not start"
    echo virtlogd >>"$vm_root/daemons"
  fi
  libvirtd -d || vm_die "libvirtd did not start"
  echo libvirtd >>"$vm_root/daemons"
  local i
  for ((i = 0; i < 100; i++)); do
    virsh -q -c "$vm_uri" version >/dev/null 2>&1 && { vm_log "started libvirtd and virtlogd"; return 0; }
    sleep 0.2
  done
  vm_die "libvirtd does not answer on $vm_uri"
}

# Stops the daemons this testbed started, once no run is left.
vm_stop_daemons() {
  [[ -f $vm_root/daemons ]] || return 0
  compgen -G "$vm_root/run.*" >/dev/null && return 0
  vm_kill /run/libvirtd.pid libvirtd
  vm_kill /run/virtlogd.pid virtlogd
  rm -f "$vm_root/daemons"
  vm_log "stopped libvirtd and virtlogd"
}

# sushy-tools in a venv that sees Debian's libvirt bindings.
vm_ensure_venv() {
  local stamp="sushy-tools==$vm_sushy $(sha256sum <"$vm_constraints" | cut -d' ' -f1)"
  if [[ "$(cat "$vm_venv/.stamp" 2>/dev/null)" == "$stamp" ]] &&
    "$vm_venv/bin/python" -c 'import libvirt, sushy_tools.emulator.main' 2>/dev/null; then
    return 0
  fi
  vm_log "creating $vm_venv (sushy-tools $vm_sushy from PyPI, Debian's python3-libvirt)"
  rm -rf "$vm_venv"
  mkdir -p "$vm_cache"
  /usr/bin/python3 -m venv --system-site-packages "$vm_venv" >&2 || vm_die "python3 -m venv failed (apt-get install python3-venv)"
  "$vm_venv/bin/pip" install -q --disable-pip-version-check -c "$vm_constraints" "sushy-tools==$vm_sushy" >&2 ||
    vm_die "pip install sushy-tools==$vm_sushy failed"
  printf '%s\n' "$stamp" >"$vm_venv/.stamp"
}

# A throw-away CA and a certificate it signed for 127.0.0.1 (the TLS BMC and the file server).
vm_certs() {
  local d=$1
  (umask 077 && mkdir -p "$d")
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
    -subj "/CN=paddock VM testbed CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null ||
    vm_die "openssl could not create the CA"
  printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'basicConstraints=critical,CA:FALSE' \
    'keyUsage=critical,digitalSignature' 'extendedKeyUsage=serverAuth' >"$d/server.ext"
  { openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$d/server.key" -out "$d/server.csr" &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 7 -extfile "$d/server.ext" -out "$d/server.pem"; } >/dev/null 2>&1 ||
    vm_die "openssl could not create the server certificate"
  chmod 644 "$d/ca.pem"
}

# The emulator's htpasswd: bcrypt at the lowest cost, so that each request stays fast.
vm_htpasswd() {
  (umask 077 && VM_PW=$3 "$vm_venv/bin/python" -c '
import bcrypt, os, sys
pw = os.environ["VM_PW"].encode()
print(sys.argv[1] + ":" + bcrypt.hashpw(pw, bcrypt.gensalt(rounds=4)).decode())' "$2" >"$1") ||
    vm_die "could not write the htpasswd file"
}

# vm_wait_url URL PIDFILE NAME: until URL answers (any HTTP status), 60 s at most, while the
# process lives (by PID only: it may not have exec'd NAME yet).
vm_wait_url() {
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$(cat "$2")" 2>/dev/null || return 1
    /usr/bin/python3 - "$1" <<'PY' && return 0
import ssl, sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2, context=ssl._create_unverified_context())
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
PY
    sleep 0.2
  done
  return 1
}

# vm_start_bmc BASE NAME PORT CERTDIR: sushy-tools with the libvirt driver, this run's domains only.
vm_start_bmc() {
  local base=$1 name=$2 port=$3 certs=$4 dir=$1/bmc-$2 scheme=http
  mkdir -p "$dir/state"
  printf '%s\n' "$port" >"$dir/port"
  [[ -z $certs ]] || scheme=https
  VM_BASE=$base VM_STATE=$dir/state VM_PORT=$port VM_CERTS=$certs VM_POOL=$(cat "$base/prefix") VM_URI=$vm_uri \
    /usr/bin/python3 "$vm_here/scripts/lib/vm-bmc-config.py" >"$dir/emulator.conf" || vm_die "could not write the $name emulator's config"
  (cd "$dir" && REQUESTS_CA_BUNDLE=$base/certs/ca.pem TMPDIR=$dir exec setsid nohup "$vm_venv/bin/python" \
    "$vm_venv/bin/sushy-emulator" --config "$dir/emulator.conf" >>"$dir/emulator.log" 2>&1 </dev/null) &
  echo $! >"$dir/pid"
  vm_wait_url "$scheme://127.0.0.1:$port/redfish/v1/" "$dir/pid" sushy-emulator ||
    { tail -n 20 "$dir/emulator.log" >&2; vm_die "the $name emulator did not come up"; }
}

# vm_start_files BASE PORT IMAGE: HTTPS file server of the wipe image (a hard link or copy), and
# of two copies of it, each with its own marker in the ISO's primary volume descriptor (its
# Application Use field, which nothing reads): the node OS image paddock-node.iso and the acceptance
# image paddock-accept.iso. Each boots the same agent (whose purpose follows its run's config) but
# has its own SHA-256 (written to BASE/files/node.sha256 and BASE/files/accept.sha256), so a report
# shows which image booted.
vm_start_files() {
  local base=$1 port=$2 dir=$1/files copy what
  mkdir -p "$dir/www"
  ln "$3" "$dir/www/paddock-wipe.iso" 2>/dev/null || cp "$3" "$dir/www/paddock-wipe.iso"
  for copy in "node:the node OS image" "accept:the acceptance image"; do
    what=${copy#*:}
    copy=${copy%%:*}
    /usr/bin/python3 - "$3" "$dir/www/paddock-$copy.iso" "$what" <<'PY' >"$dir/$copy.sha256" || vm_die "could not make $what"
import hashlib, shutil, sys
src, dst, what = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.copyfile(src, dst)
pvd, app_use = 16 * 2048, 883  # the primary volume descriptor; its Application Use field (512 bytes)
with open(dst, "r+b") as f:
    f.seek(pvd)
    if f.read(6) != b"\x01CD001":
        sys.exit("%s has no ISO 9660 primary volume descriptor at sector 16" % src)
    f.seek(pvd + app_use)
    f.write(("paddock VM testbed: " + what).encode().ljust(512, b" "))
with open(dst, "rb") as f:
    print(hashlib.file_digest(f, "sha256").hexdigest())
PY
  done
  (cd "$dir/www" && exec setsid nohup /usr/bin/python3 "$vm_here/scripts/lib/vm-files.py" "$port" \
    "$base/certs/server.pem" "$base/certs/server.key" >>"$dir/files.log" 2>&1 </dev/null) &
  echo $! >"$dir/pid"
  vm_wait_url "https://127.0.0.1:$port/" "$dir/pid" vm-files.py || vm_die "the image file server did not come up"
}

# Stops and removes one run: emulators, file server, domains, pool, files.
vm_stop_base() {
  local base=$1 prefix dom
  prefix=$(cat "$base/prefix" 2>/dev/null) || prefix=
  for pidfile in "$base"/bmc-*/pid; do [[ -f $pidfile ]] && vm_kill "$pidfile" sushy-emulator; done
  [[ -f $base/files/pid ]] && vm_kill "$base/files/pid" vm-files.py
  if [[ $prefix == paddock-vm-* ]] && virsh -q -c "$vm_uri" version >/dev/null 2>&1; then
    for dom in $(virsh -q -c "$vm_uri" list --all --name | grep "^$prefix-" || true); do
      virsh -q -c "$vm_uri" destroy "$dom" >/dev/null 2>&1 || true
      virsh -q -c "$vm_uri" undefine "$dom" >/dev/null 2>&1 || true
    done
    virsh -q -c "$vm_uri" pool-destroy "$prefix" >/dev/null 2>&1 || true
    virsh -q -c "$vm_uri" pool-undefine "$prefix" >/dev/null 2>&1 || true
  fi
  rm -rf "$base"
}

# Runs whose owner has exited.
vm_collect_stale() {
  local base owner
  for base in "$vm_root"/run.*; do
    [[ -d $base ]] || continue
    owner=$(cat "$base/owner" 2>/dev/null) || owner=
    if [[ -z $owner ]] || ! kill -0 "$owner" 2>/dev/null; then
      vm_log "removing the stale run $base"
      vm_stop_base "$base"
    fi
  done
}
