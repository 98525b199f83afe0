#!/bin/sh
# slurmctld in the foreground under tini (the image's entrypoint): the operator's arguments are
# slurmctld's, SLURMCTLD_OPTIONS adds more. No supervisord: Python's start is seconds under TCG.
set -eu
mkdir -p /run/slurmctld
# shellcheck disable=SC2086 # SLURMCTLD_OPTIONS is a word list
exec slurmctld -D ${SLURMCTLD_OPTIONS:-} "$@"
