"""Preemption: SIGTERM, SIGINT or SIGHUP on any rank stops the job at one step, agreed by all
ranks, with a checkpoint of that step written by rank 0 (Estimator's CheckpointSaverHook saves
at the end of a train() call that a hook stopped).

The signal handler only records the signal and puts the default handler back, so a second
signal ends the process at once. After every training step `StopAtSignalHook` reduces the
recorded signals of all ranks (a maximum, one scalar), so every rank stops after the same step
even when only one of them was signalled.

mpirun aborts a job on SIGTERM/SIGINT/SIGHUP (Open MPI 4: SIGTERM to the ranks, SIGKILL a
second later), but forwards SIGUSR1, SIGUSR2 and SIGALRM to every rank untouched; the launcher
therefore passes SIGINT on as SIGUSR1, SIGTERM as SIGUSR2 and SIGHUP as SIGALRM
(launch/start.py), and they mean the same here (SIGALRM only under Open MPI's mpirun, so that
no other alarm is taken for a stop). The process then ends with status 128 + the signal's
number (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP), as a shell reports a process killed
by it. A SIGHUP this process was started ignoring (nohup) stays ignored.
"""
import contextlib
import os
import signal

import tensorflow as tf
from absl import logging

from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.checkpoints import checkpoints

tf1 = tf.compat.v1

# Signal received -> the signal it stands for (the launcher's stand-ins for mpirun).
STOP_SIGNALS = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT,
                signal.SIGHUP: signal.SIGHUP, signal.SIGUSR2: signal.SIGTERM,
                signal.SIGUSR1: signal.SIGINT, signal.SIGALRM: signal.SIGHUP}

_received = []       # The first stop signal this process got (as the signal it stands for).
_agreed = {}         # {'signal': number, 'step': step} once the ranks agreed to stop.
_installed = []
_waiting = []        # [evaluations done] while the evaluator waits for a checkpoint.


class Stopped(Exception):
    """The run stopped at a signal; `exit_status` is 128 + its number."""

    def __init__(self, signum, step, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_status = 128 + signum
        super().__init__(stop_message(signum, step, checkpoint))


class EvaluationStopped(Stopped):
    """--mode=eval stopped at a signal: nothing to checkpoint; `evaluated` checkpoints done."""

    def __init__(self, signum, evaluated):  # pylint: disable=super-init-not-called
        self.signum, self.step, self.checkpoint = signum, None, None
        self.exit_status, self.evaluated = 128 + signum, evaluated
        Exception.__init__(self, 'stopped by %s during --mode=eval after %d evaluation%s; '
                           'rerun the same command to go on' % (
                               signal_name(signum), evaluated, '' if evaluated == 1 else 's'))


@contextlib.contextmanager
def waiting_for_a_checkpoint(evaluated):
    """The evaluator's wait for a checkpoint (install() first): a stop signal within it, or one
    received before, raises EvaluationStopped at once; one during an evaluation ends the run
    after it (stop_evaluation_if_asked)."""
    stop_evaluation_if_asked(evaluated)
    _waiting[:] = [evaluated]
    try:
        yield
    finally:
        del _waiting[:]


def stop_evaluation_if_asked(evaluated):
    if _received:
        raise EvaluationStopped(_received[0], evaluated)


def signal_name(signum):
    return signal.Signals(signum).name


def stop_message(signum, step, checkpoint):
    """The line printed when a run stops at a signal (checkpoint: its prefix or None)."""
    if checkpoint is None:
        return ('stopped by %s at step %d; no checkpoint was written; rerun the same command '
                'to start again' % (signal_name(signum), step))
    return ('stopped by %s at step %d; checkpoint %s written; rerun the same command to '
            'continue' % (signal_name(signum), step, checkpoint.rsplit('/', 1)[-1]))


def _on_signal(signum, _frame):
    if not _received:
        _received.append(STOP_SIGNALS[signum])
    for number in handled_signals():  # A second signal ends the process at once.
        signal.signal(number, signal.SIG_DFL)
    if _waiting:
        raise EvaluationStopped(_received[0], _waiting[0])
    logging.warning('%s received: %s; send it again to end at once', signal_name(_received[0]),
                    _stop_point[0])


def handled_signals(environ=None):
    """The signals install() takes: SIGALRM only under Open MPI's mpirun; SIGHUP not when it
    is ignored (nohup)."""
    environ = os.environ if environ is None else environ
    return [number for number in STOP_SIGNALS
            if (number != signal.SIGALRM or 'OMPI_COMM_WORLD_SIZE' in environ)
            and (number != signal.SIGHUP or signal.getsignal(number) != signal.SIG_IGN)]


_STOP_POINTS = ('the ranks stop after the next step and write its checkpoint',
                'the evaluation in progress ends, then the run')
_stop_point = [_STOP_POINTS[0]]


def install(evaluation=False):
    """Installs the handlers (main thread only; idempotent); evaluation: --mode=eval's, whose
    stop comes after the evaluation in progress."""
    _stop_point[0] = _STOP_POINTS[bool(evaluation)]
    if _installed:
        return
    for number in handled_signals():
        signal.signal(number, _on_signal)
    _installed.append(True)


def received():
    """The number of the stop signal this process got (SIGTERM's or SIGINT's), else 0: a plain
    int, which prints as the number on Python 3.10 too (a Signals member prints its name there)."""
    return int(_received[0]) if _received else 0


def agreed_signal():
    """The stop signal any rank got, agreed by all ranks (a collective: call it on all)."""
    signum = _agreed.get('signal') or max(distributed.allgather_numpy(received()))
    return int(signum)


def stop_agreed():
    """True once the ranks agreed to stop (a StopAtSignalHook saw a signal after a step, or
    agree_to_stop_at did): the same on every rank, no collective."""
    return bool(_agreed)


def agree_to_stop_at(step):
    """The stop signal any rank got, agreed by all ranks at `step` (a collective: call it on
    every rank at the same point), recorded as StopAtSignalHook records one; 0 when none.
    For a signal that came while no training step ran (an evaluation inside the training
    session, engine/training_eval.py)."""
    signum = agreed_signal()
    if signum:
        _agreed.update(signal=signum, step=int(step))
    return signum


class StopAtSignalHook(tf1.train.SessionRunHook):
    """Stops training after the first step at which any rank has a stop signal recorded."""

    def begin(self):
        with tf.device('/cpu:0'):
            self._local = tf1.placeholder_with_default(tf.constant(0.0), [], 'stop_signal')
            self._any = distributed.allreduce_max(self._local, name='stop_signal_max')
        self._step = tf1.train.get_global_step()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs([self._any, self._step],
                                        feed_dict={self._local: float(received())})

    def after_run(self, run_context, run_values):
        signum, step = run_values.results
        if signum > 0:
            _agreed.update(signal=int(signum), step=int(step) + 1)  # step: before the update.
            run_context.request_stop()


def stop_if_asked(model_dir):
    """Raises Stopped when any rank got a stop signal (a collective unless a train() call
    agreed already: call it on every rank at the same point), naming rank 0's newest
    checkpoint in model_dir, the one the Estimator wrote at the stop step."""
    signum = agreed_signal()
    if not signum:
        return
    checkpoint = checkpoints.latest_checkpoint(model_dir) if distributed.is_main() else None
    checkpoint = distributed.broadcast_object(checkpoint)
    step = checkpoints.checkpoint_step(checkpoint) if checkpoint else 0
    if _agreed.get('step') not in (None, step):
        logging.warning('the ranks stopped at step %d but the newest checkpoint is %s',
                        _agreed['step'], checkpoint)
    raise Stopped(signum, step, checkpoint)
