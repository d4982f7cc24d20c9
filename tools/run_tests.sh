#!/usr/bin/env bash
# `make test`: the suite in two parts, as steps of tools/stop_signals.sh (a stop reaches the
# running pytest once, and the script ends with it):
#  1. every test but those marked `alone`, on TEST_WORKERS processes (pytest-xdist, a test file
#     per worker at a time, the files with the most slow tests first: tests/conftest.py), the
#     30 slowest named at the end, every test's time in runs/test-times.tsv;
#  2. the tests marked `alone` (a run held to its time budget: a fine-tune of --max_minutes=4
#     ends within 10% of it), one at a time with nothing else of the suite beside them, as the
#     budget's estimates are of a machine running that command only (runs/test-times-alone.tsv);
#     with QUIET_PIDS, after those processes (CI's set-up jobs) ended.
# Both parts run; the script fails when either did. PY, TEST_WORKERS: from the Makefile.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TEST_WORKERS=${TEST_WORKERS:-2}
STOP_KEPT='the tests that ended are reported above'
source tools/stop_signals.sh
status=0
export TEST_TIMES_FILE=runs/test-times.tsv  # Read by tests/conftest.py.
step "$PY" -m pytest -q -n "$TEST_WORKERS" --dist loadfile --no-loadscope-reorder \
  --durations=30 -m "not alone" "$@" tests || status=$?
# QUIET_PIDS (.ci/run: its set-up jobs beside the suite): the alone tests start once they
# ended, at most QUIET_WAIT_SECONDS later; a job ended but not yet reaped (a zombie) counts as
# ended.
running() {  # The state after the command's name, which may hold spaces and parentheses.
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) && [ "$(echo "${stat##*) }" | cut -d' ' -f1)" != Z ]
}
quiet_until=$(( $(date +%s) + ${QUIET_WAIT_SECONDS:-1800} ))
for pid in ${QUIET_PIDS:-}; do
  if running "$pid"; then
    echo "run_tests.sh: the alone tests wait for process $pid, set-up beside the suite, to end"
  fi
  while running "$pid" && [ "$(date +%s)" -lt "$quiet_until" ]; do sleep 5; done
done
export TEST_TIMES_FILE=runs/test-times-alone.tsv
step "$PY" -m pytest -q -p no:xdist -m alone "$@" tests || status=$?
exit "$status"
