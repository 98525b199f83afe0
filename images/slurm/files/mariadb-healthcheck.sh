#!/bin/sh
# The readiness check paddock's MariaDB pod runs (`healthcheck.sh --connect --innodb_initialized`,
# the official image's): the server answers on its socket and InnoDB is up. Other flags are ignored.
set -eu
out=$(mariadb --protocol=socket -N -B -e "SELECT ENGINE FROM information_schema.ENGINES WHERE ENGINE='InnoDB' AND SUPPORT IN ('YES','DEFAULT')")
[ "$out" = InnoDB ]
