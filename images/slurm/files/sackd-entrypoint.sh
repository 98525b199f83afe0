#!/bin/sh
# The login image (the operator's LoginSet): sackd for the cluster's auth, and sshd in the
# foreground when host keys were provided (a Secret on /etc/ssh), else sackd in the foreground.
# SACKD_OPTIONS and the arguments are sackd's.
set -eu
mkdir -p /run/slurm /run/sshd
if ls /etc/ssh/ssh_host_*_key > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    sackd ${SACKD_OPTIONS:-} "$@"
    exec /usr/sbin/sshd -D -e
fi
# shellcheck disable=SC2086
exec sackd -D ${SACKD_OPTIONS:-} "$@"
