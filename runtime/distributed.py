"""Devices and workers: the only module that touches Horovod, MPI or the Habana (HPU) stack.

Without Horovod every helper is a single-process passthrough (rank 0 of 1, main), so the
same code runs under `python main.py` and `mpirun -np N python main.py`.
On Gaudi call select_device() before init(): Habana's TF helpers load the Habana module
before hvd.init(), and hvd.init() reads the knobs of habana_env_defaults().
"""

import importlib.util
import logging as _py_logging
import os
import sys

import tensorflow.compat.v1 as tf
from absl import logging

from runtime.cli import UserError

DEVICES = ('HPU', 'GPU', 'CPU')

_hvd = None          # the horovod.tensorflow module once init() has started it
_init_done = False
_devices = {}        # (no_hpu, require) -> device chosen by select_device
_hpu_probe = None    # (available, reason) after the first HPU probe


class DeviceError(UserError, RuntimeError):
    """A device was requested with --device but this host cannot provide it."""


# ----------------------------------------------------------------------------- devices

def habana_env_defaults() -> dict:
    """Environment knobs of Habana's TF EfficientDet port (Model-References), for setdefault.

    HOROVOD_CYCLE_TIME=0.5: its main.py sets it, if absent, before hvd.init() (which reads it).
    LOG_LEVEL_ALL=6: its hb_configs/*.yaml set it to silence Synapse runtime logging.
    Left out: TF_BF16_CONVERSION (the port casts in the model via use_bfloat16 instead of
    Habana's bf16 graph pass, as we do with mixed_precision_dtype); HABANA_NCCL_COMM_API=0
    (in one old revision of its main.py; unverified for SynapseAI 1.14); a TPC-fuser switch
    (its README says the fuser is disabled but names no variable; we do not guess one).
    """
    return {'HOROVOD_CYCLE_TIME': '0.5', 'LOG_LEVEL_ALL': '6'}


def _probe_hpu():
    """Imports habana_frameworks and loads its TF module once; returns (ok, reason)."""
    global _hpu_probe
    if _hpu_probe is not None:
        return _hpu_probe
    try:
        from habana_frameworks.tensorflow import load_habana_module  # pylint: disable=g-import-not-at-top
    except ImportError as err:
        missing = isinstance(err, ModuleNotFoundError) and (err.name or '').startswith('habana')
        _hpu_probe = (False, 'habana_frameworks.tensorflow is %s (pip install -r requirements-hpu.txt'
                      ' on a Gaudi host)' % ('not installed' if missing else 'broken: %s' % err))
        return _hpu_probe
    applied = {k: v for k, v in habana_env_defaults().items() if k not in os.environ}
    os.environ.update(applied)  # setdefault semantics; must precede load_habana_module()
    try:
        load_habana_module()
        _hpu_probe = (True, '')
    except Exception as err:  # pylint: disable=broad-except  # no card, driver or wrong TF
        for key in applied:  # not on an HPU after all: leave the environment as it was
            os.environ.pop(key, None)
        _hpu_probe = (False, 'load_habana_module() failed: %s: %s (is the habanalabs driver '
                      'loaded and a Gaudi visible? see hl-smi)' % (type(err).__name__, err))
    return _hpu_probe


def _gpu_available():
    return bool(tf.config.list_physical_devices('GPU'))


def _absent(device, reason):
    return DeviceError('--device=%s was requested but %s — or drop the flag to run on CPU'
                       % (device, reason))


def _choose_required(device, no_hpu):
    """Returns `device` if this host has it, else raises DeviceError saying why not."""
    if device == 'HPU':
        if no_hpu:
            raise DeviceError('--device=HPU contradicts --no_hpu; drop one of the two flags')
        available, reason = _probe_hpu()
        if not available:
            raise _absent('HPU', reason)
    elif device == 'GPU' and not _gpu_available():
        raise _absent('GPU', "tf.config.list_physical_devices('GPU') is empty (a CUDA "
                      'build of tensorflow and an NVIDIA driver are needed)')
    return device


def select_device(no_hpu: bool = False, require: str | None = None) -> str:
    """Returns 'HPU', 'GPU' or 'CPU' and logs the choice once per distinct call.

    Without `require`: HPU when habana_frameworks.tensorflow imports and load_habana_module()
    succeeds (skipped when `no_hpu`), else GPU when TensorFlow lists one, else CPU. Loading
    the Habana module makes TF place ops on the HPU, and habana_env_defaults() is applied
    (setdefault) only when that load succeeds. `require` ('hpu'/'gpu'/'cpu', any case) picks
    that device or raises DeviceError naming what is missing. Cached; same without Horovod.
    """
    wanted = None if require is None else str(require).upper()
    if wanted is not None and wanted not in DEVICES:
        raise ValueError('--device=%s is not a device; use one of %s' % (require, ', '.join(DEVICES)))
    key = (bool(no_hpu), wanted)
    if key not in _devices:
        if wanted is not None:
            device = _choose_required(wanted, no_hpu)
        elif not no_hpu and _probe_hpu()[0]:
            device = 'HPU'
        else:
            device = 'GPU' if _gpu_available() else 'CPU'
        _devices[key] = device
        logging.info('%sdevice: %s%s', rank_log_prefix(), device,
                     ' (HPU skipped: --no_hpu)' if no_hpu else '')
    return _devices[key]


def mixed_precision_dtype(device: str) -> str:
    """'float16' on GPU (the caller keeps losses in float32 and scales them), else 'bfloat16'."""
    device = str(device).upper()
    if device not in DEVICES:
        raise ValueError('unknown device %r; use one of %s' % (device, ', '.join(DEVICES)))
    return 'float16' if device == 'GPU' else 'bfloat16'


# ----------------------------------------------------------------------------- workers

def _launcher_env(names):
    for name in names:
        if os.environ.get(name, '').strip().isdigit():
            return int(os.environ[name])
    return None


def _launcher_world_size():
    """Ranks started by the MPI launcher, 1 without one: Open MPI, MPICH/Intel MPI, MVAPICH2.

    PMIx exports PMIX_RANK but no size, so `srun --mpi=pmix` is sized by SLURM_NTASKS.
    """
    size = _launcher_env(('OMPI_COMM_WORLD_SIZE', 'PMI_SIZE', 'MV2_COMM_WORLD_SIZE'))
    if size is None and 'PMIX_RANK' in os.environ:
        size = _launcher_env(('SLURM_NTASKS',))
    return size or 1


def _import_horovod(why):
    try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    except ImportError as err:
        raise ImportError(
            'Horovod is needed (%s) but horovod.tensorflow cannot be imported: %s. Install it with '
            '`bash tools/setup_env.sh` (builds horovod==0.28.1 with MPI against the installed '
            'TensorFlow), or on a Gaudi host `pip install -r requirements-hpu.txt`.'
            % (why, err)) from err
    return hvd


def init(use_horovod: bool | None = None) -> None:
    """Starts Horovod when asked to, or (use_horovod=None) when an MPI launcher started >1 rank.

    Idempotent. Without Horovod nothing is started and every helper is a passthrough.
    """
    global _hvd, _init_done
    if _init_done:
        return
    launched = _launcher_world_size()
    why = 'use_horovod=True' if use_horovod else 'the MPI launcher started %d ranks' % launched
    if use_horovod is None:
        use_horovod = launched > 1
    if use_horovod:
        hvd = _import_horovod(why)
        if _hpu_probe is None and importlib.util.find_spec('habana_frameworks') is not None:
            logging.warning('init() before select_device() on a host with habana_frameworks: the '
                            'Habana module should load before hvd.init(); call select_device() first')
        hvd.init()
        _hvd = hvd
    elif launched > 1:
        logging.warning('%d ranks were launched but Horovod is off: each trains alone', launched)
    _init_done = True
    logging.info('%sworkers: %d (horovod %s)', rank_log_prefix(), size(),
                 'on' if _hvd is not None else 'off')


def rank() -> int:
    """This worker's rank; 0 without Horovod."""
    return _hvd.rank() if _hvd else 0


def size() -> int:
    """Number of workers; 1 without Horovod."""
    return _hvd.size() if _hvd else 1


def local_rank() -> int:
    """Rank among the workers on this host; 0 without Horovod."""
    return _hvd.local_rank() if _hvd else 0


def local_size() -> int:
    """Number of workers on this host; 1 without Horovod."""
    return _hvd.local_size() if _hvd else 1


def is_main() -> bool:
    """True on rank 0 (always without Horovod): the one that writes files."""
    return rank() == 0


def is_distributed() -> bool:
    """True when Horovod runs with more than one worker."""
    return size() > 1


# ----------------------------------------------------------------------------- graph ops

def distributed_optimizer(optimizer):
    """Wraps a tf.compat.v1 optimizer to average gradients over workers; unchanged if alone."""
    return _hvd.DistributedOptimizer(optimizer, op=_hvd.Average) if is_distributed() else optimizer


def broadcast_hook() -> list:
    """Session hooks that copy rank 0's variables to all workers at start; [] if alone."""
    return [_hvd.BroadcastGlobalVariablesHook(0)] if is_distributed() else []


def allreduce_mean(tensor, name=None):
    """Mean over workers of `tensor` (same shape on all); `tensor` itself if alone.

    Differentiable (Horovod registers its gradient), so synchronous batch norm can use it.
    bfloat16 is reduced in float32, which every Horovod build supports.
    """
    if not is_distributed():
        return tensor
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype == tf.bfloat16:
        return tf.cast(_hvd.allreduce(tf.cast(tensor, tf.float32), op=_hvd.Average, name=name),
                       tf.bfloat16)
    return _hvd.allreduce(tensor, op=_hvd.Average, name=name)


# ----------------------------------------------------------------------------- Python objects

def _run_object_collective(collective, *args, **kwargs):
    """Runs a Horovod *_object collective in a throwaway graph and session.

    In graph mode Horovod builds ops and runs them in a session; a private graph keeps them
    out of the model graph, which Estimator may have finalized. CPU: the payload is host bytes.
    """
    with tf.Graph().as_default(), tf.device('/cpu:0'):
        with tf.Session(config=tf.ConfigProto(allow_soft_placement=True)) as session:
            return collective(*args, session=session, **kwargs)


def allgather_numpy(array) -> list:
    """List of every worker's numpy `array` in rank order (shapes may differ); [array] if alone."""
    if not is_distributed():
        return [array]
    return _run_object_collective(_hvd.allgather_object, array, name='runtime_allgather_numpy')


def broadcast_object(obj, root: int = 0):
    """`obj` as pickled on worker `root`, returned on every worker; `obj` itself if alone."""
    if not is_distributed():
        return obj
    return _run_object_collective(_hvd.broadcast_object, obj, root_rank=root,
                                  name='runtime_broadcast_object')


# ----------------------------------------------------------------------------- logging

def rank_log_prefix() -> str:
    """'[rank r/size] ' on non-main ranks, '' on the main rank and in a single process.

    Before init() it reads the MPI launcher's environment, so early messages are tagged too.
    """
    if _hvd:
        current, total = rank(), size()
    else:
        current = _launcher_env(('OMPI_COMM_WORLD_RANK', 'PMI_RANK', 'PMIX_RANK')) or 0
        total = _launcher_world_size()
    return '[rank %d/%d] ' % (current, total) if current != 0 else ''


class _RankTagFilter(_py_logging.Filter):
    """Prefixes each record's message with rank_log_prefix() (evaluated per record)."""

    def filter(self, record):
        prefix = rank_log_prefix()
        if prefix and not record.getMessage().startswith(prefix):  # select_device tags its own
            record.msg = prefix + str(record.msg)
        return True


class _ShortFormatter(_py_logging.Formatter):
    """'09:26:13 message', with the level named above INFO: the line a person reads. absl's
    own prefix (level, date, thread id, file:line) comes back with --verbose."""

    def format(self, record):
        level = '' if record.levelno <= _py_logging.INFO else record.levelname + ' '
        return '%s %s%s' % (self.formatTime(record, '%H:%M:%S'), level, record.getMessage())


def configure_logging(log_dir: str | None = None, program_name: str = 'efficientdet',
                      verbose: bool = True) -> None:
    """Tags non-main ranks' log lines with '[rank r/size]' and keeps their logging on stderr.

    Installs absl's handler on the root logger (as absl.app.run does). The main rank keeps
    absl's normal logging and, given `log_dir`, also writes absl's log file there; other ranks
    never write log files. tf.compat.v1.logging goes through absl's handler too. Idempotent.
    Without Horovod: only the main-rank behaviour. verbose=False: short lines (time, level
    above INFO, message) instead of absl's prefix.
    """
    logging.use_absl_handler()
    handler = logging.get_absl_handler()
    tf_logger = _py_logging.getLogger('tensorflow')
    # TF gives its logger a stderr handler when imported before absl's handler is installed;
    # its records also reach absl's handler on the root logger, so every line printed twice.
    for tf_handler in list(tf_logger.handlers):
        if type(tf_handler) is _py_logging.StreamHandler:  # pylint: disable=unidiomatic-typecheck
            tf_logger.removeHandler(tf_handler)
    for target in (handler, tf_logger):
        if not any(isinstance(f, _RankTagFilter) for f in target.filters):
            target.addFilter(_RankTagFilter())
    if not verbose:
        handler.python_handler.setFormatter(_ShortFormatter())
    if is_main():
        if log_dir:
            tf.io.gfile.makedirs(log_dir)
            handler.use_absl_log_file(program_name, log_dir)
    else:
        handler.python_handler.stream = sys.stderr
