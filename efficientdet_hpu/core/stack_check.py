"""The TensorFlow an entry point found, checked before TensorFlow is imported.

This port is built on tf.estimator, which TensorFlow removed in 2.16; its pins are 2.15.1 (CPU,
GPU) and Habana's 1.14 stack brings tensorflow-cpu 2.15.0. Another version gets one warning
line at start (a run may still work, or fail later far from the cause); no TensorFlow at all is
one error line and exit status 2 instead of an import traceback. The distribution's metadata
is read, not the module, so the check costs milliseconds and runs before tf_env's settings.
"""
import importlib.metadata
import importlib.util
import os
import sys

SUPPORTED_SERIES = '2.15.'
# The names TensorFlow is published under (NVIDIA's builds call themselves `tensorflow`).
DISTRIBUTIONS = ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu', 'tensorflow-intel',
                 'intel-tensorflow', 'tf-nightly')
HOW = ('install the pinned one: tensorflow==2.15.1 (requirements/cpu.txt, `bash '
       'tools/setup_env.sh`), or run in Habana\'s 1.14 container (tensorflow-cpu 2.15.0); '
       'see docs/install.md')


def tensorflow_distribution():
    """(name, version) of the first TensorFlow distribution installed, or None."""
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tensorflow_problem():
    """('warning' | 'error', message) about the TensorFlow found, or None when it is 2.15.x
    (or a build without distribution metadata, which is trusted)."""
    found = tensorflow_distribution()
    if found is None:
        if importlib.util.find_spec('tensorflow') is not None:
            return None
        return 'error', 'TensorFlow is not installed for %s: %s' % (sys.executable, HOW)
    name, version = found
    if version.startswith(SUPPORTED_SERIES):
        return None
    return 'warning', ('%s %s found, but this port needs TensorFlow 2.15.x (tf.estimator is gone '
                       'from 2.16): %s' % (name, version, HOW))


def check_tensorflow(program=None):
    """Prints the warning line (on the launcher's rank 0 only) or exits with the error line."""
    problem = tensorflow_problem()
    if problem is None:
        return
    program = program or os.path.basename(sys.argv[0] or 'python')
    level, message = problem
    if level == 'error':
        print('%s: error: %s' % (program, message), file=sys.stderr, flush=True)
        sys.exit(2)
    rank = os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK', '0'))
    if rank == '0':
        print('%s: warning: %s' % (program, message), file=sys.stderr, flush=True)
