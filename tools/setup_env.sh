#!/usr/bin/env bash
# Creates the virtual environment ($VENV, default .venv, at the repository root) and installs
# what the route needs. Idempotent: each step checks whether it is already done, so a re-run
# takes seconds. `make demo` and `make test` run it.
#
#   bash tools/setup_env.sh [--check-only]
#
# The interpreter: $PYTHON if set; else python3 when it is CPython 3.10 or 3.11; else python3.11
# or python3.10 on PATH; else a 3.11 from uv when uv is installed; else one line saying what was
# found and how to get a 3.10/3.11 (TensorFlow 2.15 has wheels for 3.9-3.11 only), exit 2.
# The route ($ROUTE, or found):
#   gaudi  the interpreter has habana_frameworks (Habana's container): a venv that sees its
#          site-packages, only the missing pins installed, its TensorFlow and Horovod kept,
#          nothing built;
#   gpu    nvidia-smi lists a GPU: tensorflow[and-cuda], Horovod built with MPI and NCCL;
#   cpu    otherwise: requirements.txt, Horovod built with MPI.
# The OS pieces are checked first: the interpreter's venv/ensurepip and headers are named (which
# package provides them depends on where that Python came from); a C++ compiler, cmake and
# OpenMPI (and chromium, for the tests' headless browser) are installed with apt-get when run
# as root or with sudo, else named in one line.
# A venv is trusted only when its Python runs and has pip; an incomplete one is made again.
# --check-only: choose the interpreter and route, check the OS pieces, print what would be
# installed; create and install nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
CHECK_ONLY=0
[ "${1:-}" = "--check-only" ] && CHECK_ONLY=1
HOROVOD_PIN="$(grep -E '^horovod==' requirements/horovod.txt)"
NEED="TensorFlow 2.15 needs CPython 3.10 or 3.11"
HOW="set PYTHON=/path/to/python3.11, or install one (Ubuntu: deadsnakes' python3.11 python3.11-venv python3.11-dev; pyenv install 3.11; uv python install 3.11)"

say() { echo "[setup] $*"; }
fail() { echo "setup_env.sh: error: $*" >&2; exit 2; }
py_version() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null; }
supported() { case "$(py_version "$1")" in 3.10.* | 3.11.*) return 0 ;; esac; return 1; }
real_path() { "$1" -c 'import sys; print(sys.executable)'; }

choose_python() {
  if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || fail "PYTHON=$PYTHON is not a program on this machine; $HOW"
    supported "$PYTHON" || fail "PYTHON=$PYTHON is Python $(py_version "$PYTHON" || echo '(does not run)'); $NEED; $HOW"
    PY_BASE="$(real_path "$PYTHON")"; return
  fi
  local name
  for name in python3 python3.11 python3.10; do
    if command -v "$name" >/dev/null 2>&1 && supported "$name"; then
      PY_BASE="$(real_path "$name")"; return
    fi
  done
  if command -v uv >/dev/null 2>&1; then
    uv python find 3.11 >/dev/null 2>&1 || uv python install 3.11 >&2 || fail "uv python install 3.11 failed; $HOW"
    PY_BASE="$(uv python find 3.11)"; return
  fi
  local found="no python3"
  command -v python3 >/dev/null 2>&1 && found="python3 is $(command -v python3), Python $(py_version python3 || echo '(does not run)')"
  fail "$found and no python3.11, python3.10 or uv on PATH; $NEED; $HOW"
}

has_module() { "$PY_BASE" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" 2>/dev/null; }

choose_route() {
  case "${ROUTE:-}" in
    cpu | gpu | gaudi) ;;
    "") if has_module habana_frameworks; then ROUTE=gaudi
        elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ROUTE=gpu
        else ROUTE=cpu; fi ;;
    *) fail "ROUTE=$ROUTE is not a route; use cpu, gpu or gaudi (or leave it unset)" ;;
  esac
}

# The stack a route finds or brings, for the first line the run prints.
stack() {
  local base="CPython $(py_version "$PY_BASE") ($PY_BASE)"
  case "$ROUTE" in
    cpu) echo "CPU route: $base, tensorflow 2.15.1, $HOROVOD_PIN built with MPI" ;;
    gpu) echo "GPU route: $base, tensorflow[and-cuda] 2.15.1 (CUDA 12.2, cuDNN 8.9), $HOROVOD_PIN built with MPI and NCCL" ;;
    gaudi) echo "Gaudi route: $base with $("$PY_BASE" tools/missing_requirements.py --found \
             tensorflow-cpu tensorflow habana-tensorflow habana-horovod horovod); nothing built" ;;
  esac
}

check_os_pieces() {
  local minor; minor="$(py_version "$PY_BASE" | cut -d. -f1,2)"
  local own=() system=()
  "$PY_BASE" -c 'import venv, ensurepip' >/dev/null 2>&1 || own+=("python$minor-venv")
  if [ "$ROUTE" != gaudi ]; then  # Horovod and mpi4py are compiled on these routes.
    local include; include="$("$PY_BASE" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    [ -f "$include/Python.h" ] || own+=("python$minor-dev")
    command -v c++ >/dev/null 2>&1 || system+=(g++)
    command -v cmake >/dev/null 2>&1 || system+=(cmake)
    { command -v mpirun && command -v mpicc; } >/dev/null 2>&1 || system+=(openmpi-bin libopenmpi-dev)
  fi
  # The test set opens the label review's page in a real headless browser (tests/review/).
  command -v chromium >/dev/null 2>&1 || system+=(chromium)
  if [ "${#own[@]}" -gt 0 ]; then
    fail "$PY_BASE (Python $(py_version "$PY_BASE")) lacks what Debian/Ubuntu's ${own[*]} provide: apt-get install -y ${own[*]} ${system[*]} (a Python built by hand or by pyenv must be rebuilt with them), or choose another interpreter with PYTHON="
  fi
  [ "${#system[@]}" -eq 0 ] || install_debian_packages "${system[@]}"
}

install_debian_packages() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"
    else fail "missing $*: install them with: sudo apt-get install -y $*"; fi
  fi
  command -v apt-get >/dev/null 2>&1 || fail "missing $*: install your distribution's $* (the names are Debian's)"
  if [ "$CHECK_ONLY" = 1 ]; then say "would install Debian packages: $*"; return; fi
  say "installing Debian packages: $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# The pins a route installs, as requirement files.
route_requirements() {
  case "$ROUTE" in
    cpu) echo requirements/runtime.txt requirements/cpu.txt requirements/export.txt requirements/test.txt ;;
    gpu) echo requirements/runtime.txt requirements/gpu.txt requirements/export.txt requirements/test.txt ;;
    gaudi) echo requirements/runtime.txt requirements/export.txt requirements/test.txt ;;
  esac
}

venv_trusted() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import pip' >/dev/null 2>&1 && supported "$VENV/bin/python" || return 1
  local shared=false; [ "$ROUTE" = gaudi ] && shared=true
  grep -qx "include-system-site-packages = $shared" "$VENV/pyvenv.cfg"
}

make_venv() {
  if [ -e "$VENV" ] && ! venv_trusted; then
    say "$VENV is incomplete or made for another route: it is made again"
    rm -rf "$VENV"
  fi
  [ -e "$VENV" ] && return
  local shared=(); [ "$ROUTE" = gaudi ] && shared=(--system-site-packages)
  say "creating $VENV with $PY_BASE"
  if ! "$PY_BASE" -m venv "${shared[@]}" "$VENV" >&2; then
    rm -rf "$VENV"  # never leave a half-made venv for the next run
    fail "$PY_BASE -m venv $VENV failed (above); nothing was left behind"
  fi
}

install_requirements() {
  local py="$VENV/bin/python" files; files="$(route_requirements)"
  local stamp="$VENV/.requirements.sha" want
  want="$(cat $files requirements/*.txt pyproject.toml | sha256sum | cut -c1-16)-$ROUTE"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return
  local pins="$VENV/.requirements-to-install.txt"
  if [ "$ROUTE" = gaudi ]; then  # only what the container lacks, its versions kept
    "$PY_BASE" tools/missing_requirements.py $files > "$pins"
  else
    grep -h -v -e '^#' -e '^$' $files > "$pins"
  fi
  say "installing $(grep -c . "$pins" || true) pinned requirements of $files"
  "$py" -m pip install -q --upgrade pip setuptools wheel
  # mpi4py compiles one huge C file: about 15 minutes at the default -O3 on 2 cores, under a
  # minute at -O0. It only carries small control messages here, so its speed does not matter.
  if grep -q '^mpi4py==' "$pins" && ! "$py" -c "import mpi4py" >/dev/null 2>&1; then
    CFLAGS="-O0" "$py" -m pip install -q "$(grep '^mpi4py==' "$pins")"
  fi
  [ ! -s "$pins" ] || "$py" -m pip install -q -r "$pins"
  "$py" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
}

build_horovod() {
  local py="$VENV/bin/python"
  if [ "$ROUTE" = gaudi ]; then
    has_module horovod || say "no Horovod in this environment: multi-rank runs need Habana's (pip install -r requirements-hpu.txt)"
    return
  fi
  "$py" -c "import horovod.tensorflow as h; assert h.mpi_built()" >/dev/null 2>&1 && return
  say "building $HOROVOD_PIN against the installed TensorFlow (about 6 minutes the first time)"
  local gpu=(); [ "$ROUTE" = gpu ] && gpu=(HOROVOD_GPU_OPERATIONS=NCCL)
  env "${gpu[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
    "$py" -m pip install -q --no-build-isolation "$HOROVOD_PIN"
}

# The whole file is read before anything runs (main is called on its last line), so editing
# it while a long install runs cannot change what that run does next.
main() {
  choose_python
  choose_route
  say "$(stack)"
  check_os_pieces
  if [ "$CHECK_ONLY" = 1 ]; then
    if [ -e "$VENV" ] && ! venv_trusted; then say "$VENV is incomplete or made for another route: it would be made again"; fi
    if [ "$ROUTE" = gaudi ]; then
      say "would install into $VENV: $("$PY_BASE" tools/missing_requirements.py $(route_requirements) | tr '\n' ' ')"
    else
      say "would install into $VENV: $(route_requirements) and $HOROVOD_PIN"
    fi
    exit 0
  fi
  make_venv
  install_requirements
  build_horovod
}

main "$@"; exit
