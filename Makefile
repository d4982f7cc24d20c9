# The two set-up commands of the README: `make demo` and `make test`. Both create .venv when it is
# missing (tools/setup_env.sh is idempotent: a re-run takes seconds). `make test PYTHON=python3.10
# VENV=.venv310` sets up and tests another interpreter beside it; ROUTE=cpu|gpu|gaudi chooses the
# route when the one found is not wanted (docs/install.md).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= runs/demo
DATA_DIR ?= data/synthetic
# Test processes (pytest-xdist, one test file per worker at a time): most tests wait on a
# single-threaded graph build in a subprocess, so two workers use both cores of a 2-core box.
TEST_WORKERS ?= 2

.PHONY: venv test test-fast demo bench clean-demo trees-data trees

# Each long recipe `exec`s its command, so the command is make's own child and gets the SIGTERM
# make passes on when it is sent one (a shell in between would die of it and leave the command
# running). tools/stop_signals.sh says what reaches what; docs/troubleshooting.md.

venv:
	@VENV=$(VENV) exec bash tools/setup_env.sh

# tools/run_tests.sh: the suite on TEST_WORKERS processes, then the tests marked `alone` by
# themselves (a run held to its time budget); the 30 slowest tests named, where the time goes.
test: venv
	@PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) exec bash tools/run_tests.sh

# ~2 min on 2 cores: the suite minus `slow` tests (TensorFlow/mpirun processes, training, full-size nets).
test-fast: venv
	exec $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

demo: venv
	@PY=$(PY) DEMO_DIR=$(DEMO_DIR) DATA_DIR=$(DATA_DIR) exec bash tools/demo.sh

bench: venv
	exec $(PY) bench.py suite --output docs/benchmarks-$$(hostname).md

clean-demo:
	rm -rf $(DEMO_DIR) $(DATA_DIR)

# The aerial-tree experiment (docs/trees.md): `make trees-data` fetches deepforest's photos and
# the Lite0 ImageNet weights and builds the tiled dataset (about a minute); `make trees` also
# fine-tunes Lite0 from ImageNet and from random weights and scores both on the held-out photo.
trees-data: venv
	@PY=$(PY) exec bash tools/trees.sh data

trees: venv
	@PY=$(PY) exec bash tools/trees.sh all
