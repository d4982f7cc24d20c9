"""Workers: Horovod's ranks and collectives, the only module that imports horovod.

Without Horovod every helper is a single-process passthrough (rank 0 of 1, main), so the
same code runs under `python main.py` and `mpirun -np N python main.py`. On Gaudi,
devices.select_device() runs before init(): Habana's module loads before hvd.init(), and
hvd.init() reads the knobs of habana.habana_env_defaults().
"""
import os

import tensorflow.compat.v1 as tf
from absl import logging

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.runtime import habana

_hvd = None          # the horovod.tensorflow module once init() has started it
_init_done = False


def launcher_env(names):
    for name in names:
        if os.environ.get(name, '').strip().isdigit():
            return int(os.environ[name])
    return None


def launcher_world_size():
    """Ranks started by the MPI launcher, 1 without one: Open MPI, MPICH/Intel MPI, MVAPICH2.

    PMIx exports PMIX_RANK but no size, so `srun --mpi=pmix` is sized by SLURM_NTASKS.
    """
    size = launcher_env(('OMPI_COMM_WORLD_SIZE', 'PMI_SIZE', 'MV2_COMM_WORLD_SIZE'))
    if size is None and 'PMIX_RANK' in os.environ:
        size = launcher_env(('SLURM_NTASKS',))
    return size or 1


class HorovodMissing(UserError, ImportError):
    """A multi-rank run (or --use_horovod) on an environment without Horovod: one line."""


def _import_horovod(why):
    try:
        import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    except ImportError as err:
        raise HorovodMissing(
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
    launched = launcher_world_size()
    why = 'use_horovod=True' if use_horovod else 'the MPI launcher started %d ranks' % launched
    if use_horovod is None:
        use_horovod = launched > 1
    if use_horovod:
        hvd = _import_horovod(why)
        if not habana.probed() and habana.installed():
            logging.warning('init() before select_device() on a host with habana_frameworks: the '
                            'Habana module should load before hvd.init(); call select_device() first')
        hvd.init()
        _hvd = hvd
    elif launched > 1:
        logging.warning('%d ranks were launched but Horovod is off: each trains alone', launched)
    _init_done = True
    logging.info('%sworkers: %d (horovod %s)', launcher_rank_prefix(), size(),
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

def allreduce_gradients(gradients) -> list:
    """Mean over workers of each gradient in one grouped allreduce (None kept); the list
    itself if alone. What DistributedOptimizer.compute_gradients does, callable on gradients
    summed over micro-batches, so a step with gradient accumulation allreduces once."""
    if not is_distributed():
        return list(gradients)
    present = [tf.convert_to_tensor(g) for g in gradients if g is not None]
    reduced = iter(_hvd.grouped_allreduce(present, op=_hvd.Average))
    return [None if g is None else next(reduced) for g in gradients]


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


def allreduce_max(tensor, name=None):
    """Elementwise maximum over workers of a float32 `tensor` (same shape on all); `tensor`
    itself if alone. Used for flags every rank must agree on (a stop asked of any rank)."""
    if not is_distributed():
        return tensor
    return _hvd.allreduce(tf.convert_to_tensor(tensor), op=_hvd.Max, name=name)


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


def launcher_rank_prefix() -> str:
    """'[rank r/size] ' on non-main ranks, '' on the main rank and in a single process.

    Before init() it reads the MPI launcher's environment, so early messages are tagged too.
    """
    if _hvd:
        current, total = rank(), size()
    else:
        current = launcher_env(('OMPI_COMM_WORLD_RANK', 'PMI_RANK', 'PMIX_RANK')) or 0
        total = launcher_world_size()
    return '[rank %d/%d] ' % (current, total) if current != 0 else ''
