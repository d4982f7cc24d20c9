"""Process settings TensorFlow reads once, when it is first imported, and the quiet screen.

Entry points (main.py, inference.py, bench.py) import this module before anything imports
tensorflow; it first checks the TensorFlow installed (stack_check: one line unless 2.15.x). A
value already in the environment always wins, so a user can still say
`TF_ENABLE_ONEDNN_OPTS=0 python main.py ...` or `TF_CPP_MIN_LOG_LEVEL=0 ...`.

- TF_ENABLE_ONEDNN_OPTS=1: oneDNN CPU kernels. TensorFlow 2.15 turns them on by itself only on
  CPUs with AVX512-VNNI/BF16/AMX; on this project's AVX2 benchmark VM they make D0 training
  about 20% faster (docs/benchmarks-vm.md, the `oneDNN off` rows). No effect on HPU kernels.
- TF_CPP_MIN_LOG_LEVEL=3 unless --verbose: TensorFlow's C++ start-up lines (cuDNN/cuFFT/cuBLAS
  factory registration errors on a machine without a GPU, the TF-TRT and CPU-feature notices)
  stay off the screen. Real failures still reach the user: they raise Python exceptions.
- `quiet_python_logging()`, called once TensorFlow is imported: TensorFlow's Python logger (the
  Estimator's INFO chatter, the RunConfig dump, "Use tf.keras instead" deprecation notices) is
  raised to ERROR unless --verbose. The project's own lines go through absl's logger and stay.
"""
import contextlib
import logging
import os
import sys
import tempfile
import warnings

from efficientdet_hpu.core import stack_check
from efficientdet_hpu.core.errors import verbose_requested

stack_check.check_tensorflow()  # one line when the TensorFlow found is not 2.15.x
VERBOSE = verbose_requested()
DEFAULTS = {'TF_ENABLE_ONEDNN_OPTS': '1'}
if not VERBOSE:
    DEFAULTS['TF_CPP_MIN_LOG_LEVEL'] = '3'

for _name, _value in DEFAULTS.items():
    os.environ.setdefault(_name, _value)


def quiet_python_logging(verbose=VERBOSE):
    """TensorFlow's Python-side logging and deprecation notices: ERROR only unless verbose."""
    if verbose:
        return
    logging.getLogger('tensorflow').setLevel(logging.ERROR)
    warnings.filterwarnings('ignore', category=DeprecationWarning)
    warnings.filterwarnings('ignore', category=FutureWarning)
    try:
        from tensorflow.python.util import deprecation  # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access


@contextlib.contextmanager
def quiet_native_output(verbose=VERBOSE):
    """Keeps what TensorFlow's native code prints straight to the process's stdout/stderr
    (the TFLite converter's per-op summary, MLIR notices) off the screen unless verbose: file
    descriptors 1 and 2 point at a temporary file inside the block. Errors still reach the
    user as the Python exceptions the converter raises."""
    if verbose:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for descriptor in saved:
            os.close(descriptor)
