#!/bin/bash
# MariaDB (Debian's mariadb-server) with the variables of the official image that paddock's
# MariaDB pod sets: on a data directory without a database, MARIADB_DATABASE is created and
# MARIADB_USER (password MARIADB_PASSWORD, or the file MARIADB_PASSWORD_FILE) is granted all on it
# from any host. root stays local and authenticates by the socket only (the healthcheck's way in),
# so MARIADB_RANDOM_ROOT_PASSWORD needs nothing; MARIADB_ROOT_PASSWORD, when set, also gives root a
# password from any host. Then mariadbd in the foreground on 3306, as `mysql`.
set -euo pipefail
datadir=/var/lib/mysql
file_env() { local v=$1 f="${1}_FILE"; if [ -n "${!f:-}" ]; then printf -v "$v" '%s' "$(< "${!f}")"; fi; }
file_env MARIADB_PASSWORD
file_env MARIADB_ROOT_PASSWORD
sql_string() { printf "'%s'" "$(printf '%s' "$1" | sed "s/\\\\/\\\\\\\\/g; s/'/\\\\'/g")"; }
mkdir -p /run/mysqld "$datadir"
chown mysql:mysql /run/mysqld "$datadir"
if [ ! -d "$datadir/mysql" ]; then
    echo "mariadb-entrypoint: initialising $datadir"
    mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db --auth-root-authentication-method=socket \
        --skip-name-resolve > /dev/null
    {
        echo "FLUSH PRIVILEGES;"
        if [ -n "${MARIADB_ROOT_PASSWORD:-}" ]; then
            echo "CREATE USER 'root'@'%' IDENTIFIED BY $(sql_string "$MARIADB_ROOT_PASSWORD");"
            echo "GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;"
        fi
        if [ -n "${MARIADB_DATABASE:-}" ]; then
            echo "CREATE DATABASE IF NOT EXISTS \`${MARIADB_DATABASE//\`/}\`;"
        fi
        if [ -n "${MARIADB_USER:-}" ]; then
            echo "CREATE USER $(sql_string "$MARIADB_USER")@'%' IDENTIFIED BY $(sql_string "${MARIADB_PASSWORD:-}");"
            [ -n "${MARIADB_DATABASE:-}" ] &&
                echo "GRANT ALL ON \`${MARIADB_DATABASE//\`/}\`.* TO $(sql_string "$MARIADB_USER")@'%';"
        fi
    } | mariadbd --user=mysql --datadir="$datadir" --bootstrap --skip-networking > /dev/null
    echo "mariadb-entrypoint: database ${MARIADB_DATABASE:-(none)}, user ${MARIADB_USER:-(none)} created"
fi
exec mariadbd --user=mysql --datadir="$datadir" --bind-address=0.0.0.0 --port=3306 --skip-name-resolve "$@"
