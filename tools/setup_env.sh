#!/usr/bin/env bash
# Creates .venv at the repository root and installs everything the project needs.
# Idempotent: each step checks whether it is already done, so a re-run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
HOROVOD_VERSION=0.28.1

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
  echo "[setup] installing OpenMPI (Debian openmpi-bin, libopenmpi-dev)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"

stamp="$VENV/.requirements.sha"
want="$(sha256sum requirements.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing pinned requirements"
  "$PY" -m pip install -q --upgrade pip setuptools wheel
  # mpi4py compiles one huge C file: about 15 minutes at the default -O3 on 2 cores, under a
  # minute at -O0. It only carries small control messages here, so its speed does not matter.
  if ! "$PY" -c "import mpi4py" >/dev/null 2>&1; then
    CFLAGS="-O0" "$PY" -m pip install -q "$(grep -E '^mpi4py==' requirements.txt)"
  fi
  "$PY" -m pip install -q -r requirements.txt
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

if ! "$PY" -c "import horovod.tensorflow as h; assert h.mpi_built()" >/dev/null 2>&1; then
  echo "[setup] building horovod $HOROVOD_VERSION against the installed TensorFlow (about 6 minutes the first time)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
    "$PY" -m pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
fi
