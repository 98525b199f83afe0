# shellcheck shell=bash
# Shared helpers for scripts/redfish-start and scripts/redfish-stop (sourced, not executed).
#
# Each run of redfish-start gets its own base directory $HOME/.cache/paddock/test-redfish/run.XXXXXX
# (unless PADDOCK_TEST_REDFISH_DIR names one), so that concurrent `scripts/test` runs on one machine
# never stop each other's emulators. The directory records the PID of the process that owns the run
# (PADDOCK_TEST_REDFISH_OWNER, default redfish-start's parent: scripts/test or your shell); runs
# whose owner has exited are stopped and removed by the next redfish-start or redfish-stop.

rf_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
rf_die() { rf_log "error: $*"; exit 1; }

rf_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
rf_launcher=${PADDOCK_REDFISH_EMULATOR_DIR:-$rf_repo/../shared/redfish-emulator}
rf_root=${HOME:-/tmp}/.cache/paddock/test-redfish

# Fails unless the shared launcher (start/stop) is there; resolves it to an absolute path.
rf_need_launcher() {
  [[ -x $rf_launcher/start && -x $rf_launcher/stop ]] ||
    rf_die "no Redfish emulator launcher in $rf_launcher (set PADDOCK_REDFISH_EMULATOR_DIR to shared/redfish-emulator)"
  rf_launcher=$(cd "$rf_launcher" && pwd -P)
}

# Stops the emulators of one base directory (the launcher checks each PID still is its emulator).
rf_stop_base() {
  local name status=0
  for name in tls main; do
    [[ -d $1/$name ]] || continue
    REDFISH_EMULATOR_RUN_DIR=$1/$name "$rf_launcher/stop" || status=1
  done
  return "$status"
}

# Stops and removes runs under $rf_root whose owner has exited. A run without an owner file is
# being created right now, unless it is older than ten minutes.
rf_collect_stale() {
  local d owner
  [[ -d $rf_root ]] || return 0
  for d in "$rf_root"/run.*; do
    [[ -d $d ]] || continue
    owner=$(cat "$d/owner" 2>/dev/null || true)
    if [[ -z $owner ]]; then
      [[ -n $(find "$d" -maxdepth 0 -mmin +10 2>/dev/null) ]] || continue
    elif [[ $owner =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null; then
      continue
    fi
    rf_log "cleaning up the run in $d (owner ${owner:-unknown} has exited)"
    rf_stop_base "$d" || true
    rm -rf -- "$d"
  done
}
