# Sourced by tools/demo.sh and tools/trees.sh: `step COMMAND...` runs one step of the script so
# that a stop reaches it exactly once, as core/processes.py does for the Python commands.
#
# Each step runs in a process group of its own (set -m), so neither a terminal's Ctrl-C nor a
# signal to make's process group reaches it directly; SIGTERM, SIGINT or SIGHUP to the script is
# passed on to the step once (main.py then writes the checkpoint of the step it is at), the
# script waits for it up to STOP_GRACE_SECONDS, kills what is left of its group, prints one line
# and exits 128+N. A second signal kills the step at once. The same signal again within half a
# second is the same stop: `timeout` sends it to the command and then to its process group,
# and make passes SIGTERM on to a recipe whose process group got it too.
#
# What reaches what under make (GNU make 4): Ctrl-C and a closed terminal signal the foreground
# process group (make and this script: one stop); `kill MAKE_PID` (SIGTERM) makes make pass
# SIGTERM to this script and wait for it; make passes SIGINT and SIGHUP sent to its pid alone on
# to nobody (it expects its process group to have got them): send those to the group,
# `kill -INT -- -PGID`, or SIGTERM to make.
set -m
STOP_GRACE_SECONDS=${STOP_GRACE_SECONDS:-120}
STOP_KEPT=${STOP_KEPT:-what the finished steps wrote is kept; rerun the same command to continue}
_step_pid=
_watchdog_pid=
_stop_number=
_stop_time=

_stop() {  # _stop NAME NUMBER: the trap of each stop signal.
  local now=${EPOCHREALTIME:-${SECONDS}.000000}  # Microseconds (bash 5; else whole seconds).
  now=${now/./}
  if [ -n "$_stop_number" ]; then
    # `return 0`, not `return`: in a trap handler bash 5.2 returns the status from before the
    # trap, an interrupted `wait`'s 128+N, and under the scripts' `set -e` the trap's failing
    # command ends the script silently while its step still runs.
    if [ "$2" = "$_stop_number" ] && (( now - _stop_time < 500000 )); then return 0; fi
    if [ -n "$_step_pid" ]; then kill -KILL -- "-$_step_pid" 2>/dev/null || true; fi
    echo "$(basename "$0"): stopped by SIG$1 (a second stop signal: its processes were killed at once); $STOP_KEPT" >&2
    exit $((128 + $2))
  fi
  _stop_number=$2 _stop_time=$now
  if [ -z "$_step_pid" ]; then
    echo "$(basename "$0"): stopped by SIG$1; $STOP_KEPT" >&2
    exit $((128 + $2))
  fi
  echo "$(basename "$0"): SIG$1: passed on to the running step, which ends cleanly; waiting up to $STOP_GRACE_SECONDS s (send it again to end at once)" >&2
  kill -"$1" "$_step_pid" 2>/dev/null || true
  # The deadline: a job of its own that kills the step's group unless the step ends first.
  (sleep "$STOP_GRACE_SECONDS"; kill -KILL -- "-$_step_pid" 2>/dev/null) &
  _watchdog_pid=$!
  disown "$_watchdog_pid"  # No job report when it is killed.
  return 0
}
trap '_stop TERM 15' TERM
trap '_stop INT 2' INT
trap '_stop HUP 1' HUP

step() {  # step COMMAND...: runs it as above; returns its status, or exits 128+N at a stop.
  local status
  "$@" &
  _step_pid=$!
  while :; do
    status=0
    wait "$_step_pid" || status=$?
    # A trapped signal ends `wait` early (status > 128) while the step still runs.
    kill -0 "$_step_pid" 2>/dev/null || break
  done
  kill -KILL -- "-$_step_pid" 2>/dev/null || true  # What the step left in its group.
  _step_pid=
  if [ -n "$_stop_number" ]; then
    if [ -n "$_watchdog_pid" ]; then kill -KILL -- "-$_watchdog_pid" 2>/dev/null || true; fi
    echo "$(basename "$0"): stopped by $(kill -l "$_stop_number" | sed 's/^/SIG/'); $STOP_KEPT" >&2
    exit $((128 + _stop_number))
  fi
  return "$status"
}
