#!/bin/bash
# slurmd in the foreground under tini (the image's entrypoint), as the Slinky images start it:
# the operator's arguments (`-Z --conf-server ... --conf '...'`) and SLURMD_OPTIONS are slurmd's;
# POD_CPUS / POD_MEMORY (MiB) / POD_TOPOLOGY, when set, become CoreSpecCount / MemSpecLimit /
# Topology items of `--conf` (the node's resources less the pod's, from `slurmd -C`). sshd runs
# beside it only when host keys were provided (a Secret mounted on /etc/ssh): generating them
# takes 10+ s under TCG.
set -euo pipefail
opts="${SLURMD_OPTIONS:-} $*"
mkdir -p /run/slurm /var/spool/slurmd /run/sshd
conf=()
if [ "${POD_CPUS:-0}" -gt 0 ] || [ "${POD_MEMORY:-0}" -gt 0 ]; then
    hw=$(slurmd -C)
    field() { echo "$hw" | grep -Eo "$1=[0-9]+" | head -n1 | cut -d= -f2; }
    if [ "${POD_CPUS:-0}" -gt 0 ]; then
        cores=$(($(field Boards) * $(field SocketsPerBoard) * $(field CoresPerSocket)))
        spec=$((cores - POD_CPUS / $(field ThreadsPerCore)))
        [ "$spec" -gt 0 ] && conf+=("CoreSpecCount=$spec")
    fi
    if [ "${POD_MEMORY:-0}" -gt 0 ]; then
        spec=$(($(field RealMemory) - POD_MEMORY))
        [ "$spec" -gt 0 ] && conf+=("MemSpecLimit=$spec")
    fi
fi
[ -n "${POD_TOPOLOGY:-}" ] && conf+=("Topology=$POD_TOPOLOGY")
# The items join the `--conf` argument the operator gave, or a new one.
args=()
eval "set -- $opts"
while [ $# -gt 0 ]; do
    case "$1" in
    --conf=*) args+=("--conf=${1#--conf=}${conf[*]:+ ${conf[*]}}"); conf=() ;;
    --conf) args+=(--conf "$2${conf[*]:+ ${conf[*]}}"); conf=(); shift ;;
    *) args+=("$1") ;;
    esac
    shift
done
[ ${#conf[@]} -gt 0 ] && args+=(--conf "${conf[*]}")
if ls /etc/ssh/ssh_host_*_key > /dev/null 2>&1; then /usr/sbin/sshd; fi
exec slurmd -D "${args[@]}"
