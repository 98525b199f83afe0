# shellcheck shell=bash
# Shared helpers for scripts/pg-start and scripts/pg-stop (sourced, not executed).
#
# Binary lookup mirrors paddock-pgembed's find_binaries(): PADDOCK_PG_BIN_DIR, `pg_ctl` on PATH
# (symlinks resolved), /usr/lib/postgresql/<highest>/bin, /usr/local/pgsql/bin, Homebrew.

pg_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
pg_die() { pg_log "error: $*"; exit 1; }

pg_install_hint="PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them: \
Debian/Ubuntu \`sudo apt-get install postgresql\`, Fedora \`sudo dnf install postgresql-server\`, \
macOS \`brew install postgresql@16\`; or set PADDOCK_PG_BIN_DIR to the directory holding pg_ctl."

pg_is_root() { [[ $(id -u) == 0 ]]; }

# True when $1 holds the three server programs.
pg_complete_bin_dir() { [[ -x $1/pg_ctl && -x $1/initdb && -x $1/postgres ]]; }

# Prints the server binary directory; returns 1 when there is none.
pg_find_bin_dir() {
  local d
  if [[ -n ${PADDOCK_PG_BIN_DIR:-} ]]; then
    pg_complete_bin_dir "$PADDOCK_PG_BIN_DIR" ||
      pg_die "PADDOCK_PG_BIN_DIR=$PADDOCK_PG_BIN_DIR does not hold pg_ctl, initdb and postgres"
    printf '%s\n' "$PADDOCK_PG_BIN_DIR"
    return 0
  fi
  if d=$(command -v pg_ctl 2>/dev/null); then
    d=$(dirname "$(readlink -f "$d")")
    if pg_complete_bin_dir "$d"; then printf '%s\n' "$d"; return 0; fi
  fi
  for d in $(ls -1 /usr/lib/postgresql 2>/dev/null | sort -rV) /usr/local/pgsql \
           $(ls -1d /opt/homebrew/opt/postgresql* /usr/local/opt/postgresql* 2>/dev/null | sort -rV); do
    [[ $d == /* ]] || d=/usr/lib/postgresql/$d
    if pg_complete_bin_dir "$d/bin"; then printf '%s\n' "$d/bin"; return 0; fi
  done
  return 1
}

# Installs PostgreSQL when we are root on a Debian-like system; otherwise says what to install.
pg_install() {
  if ! pg_is_root || ! command -v apt-get >/dev/null; then
    pg_die "$pg_install_hint"
  fi
  pg_log "PostgreSQL server binaries not found; installing the postgresql package"
  # The tests run their own cluster: keep the package from creating and starting one on 5432.
  mkdir -p /etc/postgresql-common/createcluster.d
  echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/paddock.conf
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; } >&2 ||
    pg_die "installing postgresql with apt-get failed"
}

# Runs a command as the server user: `postgres` when we are root (PostgreSQL refuses root),
# ourselves otherwise. cwd is / because root's cwd may be unreadable for postgres.
pg_as_server() {
  if ! pg_is_root; then
    "$@"
  elif command -v runuser >/dev/null; then
    (cd / && runuser -u postgres -- "$@")
  else
    # shellcheck disable=SC2016 # $0/$@ are for the inner shell
    (cd / && su -s /bin/sh postgres -c 'exec "$0" "$@"' "$@")
  fi
}

# The base directory of the test cluster (see scripts/pg-start for why root differs).
pg_test_base() {
  if [[ -n ${PADDOCK_TEST_PG_DIR:-} ]]; then
    printf '%s\n' "$PADDOCK_TEST_PG_DIR"
  elif pg_is_root; then
    printf '/var/tmp/paddock-test-pg-%s\n' "$(id -u)"
  else
    printf '%s\n' "$HOME/.cache/paddock/test-pg"
  fi
}
