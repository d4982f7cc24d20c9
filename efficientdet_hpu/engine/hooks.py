"""Session hooks of a training run: the progress line (and its JSON log record), the profiler
window, and the guard that stops at the first non-finite loss.

Only rank 0 writes files; every rank logs (other ranks to stderr with their rank tag).
"""
import math
import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from efficientdet_hpu.core import progress
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.engine import train_log
from efficientdet_hpu.engine import setup
from efficientdet_hpu.training import steps_file
from efficientdet_hpu.engine import wall_time

tf1 = tf.compat.v1


def weights_checksum(values):
    """float64 sum of |w| over the trainable variables' values (arrays): one number to
    compare across ranks. In NumPy at the end: as graph ops (~1,200 for D0) it cost ~1 s of
    start-up."""
    return float(sum(np.abs(np.asarray(value, np.float64)).sum() for value in values))


class TrainLogHook(tf1.train.SessionRunHook):
    """Every n steps, and at the step where this train() call stops: step, losses, learning
    rate, images/s and ETA, to the log and as a JSON log record."""

    def __init__(self, model_dir, global_batch, total_steps, every_n_steps, write_files,
                 stop_step=None, pause_steps=()):
        """total_steps: the run's final step (for the ETA); stop_step: where this train()
        call stops; pause_steps: steps after which the training pauses (an evaluation inside
        the session): logged too, whatever every_n_steps, and the rate is measured again
        from the step after the pause."""
        self._model_dir, self._global_batch = model_dir, global_batch
        self._total_steps, self._every_n = total_steps, max(1, every_n_steps)
        self._stop_step = stop_step or total_steps
        self._pause_steps = frozenset(pause_steps)
        self._write_files = write_files
        self._meter = progress.Meter(total_steps)  # Marked where the rate is measured from.
        self._paused_at = None  # The clock restarts at the next before_run.

    def retarget(self, total_steps, stop_step, pause_steps=None):
        """The run now ends at `total_steps`, this train() call at `stop_step`, and pauses at
        `pause_steps` when given (training/steps_file.py)."""
        self._total_steps = self._meter.total = total_steps
        self._stop_step = stop_step
        if pause_steps is not None:
            self._pause_steps = frozenset(pause_steps)

    def begin(self):
        self._scalars = tf1.get_collection(det_model_fn.TRAIN_LOG_COLLECTION)
        self._step = tf1.train.get_global_step()
        self._weights = tf1.trainable_variables()

    def end(self, session):
        # Every rank logs it: equal values show the ranks ended with identical weights.
        step, values = session.run([self._step, self._weights])
        logging.info('final weights at step %d: checksum %.12e', step, weights_checksum(values))

    def before_run(self, run_context):
        if self._paused_at is not None:
            self._meter.mark(self._paused_at, time.time())
            self._paused_at = None
        return tf1.train.SessionRunArgs([self._step, self._scalars])

    def after_run(self, run_context, run_values):
        step, scalars = run_values.results
        step += 1  # The value fetched is from before this step's update.
        now = time.time()
        if self._meter.marked_time is None:
            self._meter.mark(step, now)
            return
        if step in self._pause_steps:
            self._log(step, scalars, now)
            self._paused_at = step
            return
        if step % self._every_n and step != self._stop_step:
            return
        self._log(step, scalars, now)

    def _log(self, step, scalars, now):
        steps_per_sec, eta_sec = self._meter.rate(step, now), self._meter.eta(step, now)
        self._meter.mark(step, now)
        record = dict(zip(det_model_fn.TRAIN_LOG_KEYS, (float(v) for v in scalars)))
        current, peak = train_log.host_memory_mb()
        record.update(event='train', step=int(step), time=now, total_steps=self._total_steps,
                      images_per_sec=steps_per_sec * self._global_batch, eta_sec=eta_sec,
                      host_memory_mb=current, peak_host_memory_mb=peak)
        logging.info('step %d/%d loss %.4f (cls %.4f box %.5f) lr %.5f %.2f images/s ETA %s',
                     step, self._total_steps, record['loss'], record['cls_loss'],
                     record['box_loss'], record['learning_rate'], record['images_per_sec'],
                     progress.format_seconds(record['eta_sec']))
        if self._write_files:
            train_log.append_json_log(self._model_dir, record)
            train_log.append_memory_csv(self._model_dir, step, current, peak,
                                      train_log.device_memory_mb())
            writer = tf1.summary.FileWriterCache.get(self._model_dir)
            writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
                tag='train/images_per_sec', simple_value=record['images_per_sec'])]), step)


class SummaryHook(tf1.train.SessionRunHook):
    """The graph's TensorBoard summaries at the first step and every n steps after, written as
    Estimator's SummarySaverHook writes them, but fetched at every step. That hook fetches
    them only on the steps it writes, so the first step and the next asked for different
    fetches and the session optimised the training graph twice (D0: ~16 s more at start)."""

    def __init__(self, log_dir, every_n_steps):
        self._log_dir, self._every_n = log_dir, max(1, every_n_steps)

    def begin(self):
        summary = tf1.summary.merge_all()
        self._fetches = {'step': tf1.train.get_global_step()}
        if summary is not None:
            self._fetches['summary'] = summary
        self._writer = tf1.summary.FileWriterCache.get(self._log_dir)
        self._written_step = None

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        step = int(run_values.results['step'])
        if self._written_step is None:
            self._writer.add_session_log(tf1.SessionLog(status=tf1.SessionLog.START), step)
        elif step < self._written_step + self._every_n:
            return
        if 'summary' in run_values.results:
            self._writer.add_summary(run_values.results['summary'], step)
        self._written_step = step

    def end(self, session):
        self._writer.flush()


class ProfilerWindowHook(tf1.train.SessionRunHook):
    """Traces this process's training steps START..END (1-based, inclusive) with the TensorFlow
    profiler into logdir, readable in TensorBoard's profile tab."""

    def __init__(self, start, end, logdir):
        self._start, self._end, self._logdir = start, end, logdir
        self._count, self._active = 0, False

    def before_run(self, run_context):
        self._count += 1
        if self._count == self._start:
            tf.profiler.experimental.start(self._logdir)
            self._active = True

    def after_run(self, run_context, run_values):
        if self._count == self._end:
            self.end(None)

    def end(self, session):
        if self._active:
            tf.profiler.experimental.stop()
            self._active = False
            logging.info('profiler trace of steps %d..%d written under %s',
                         self._start, self._end, self._logdir)


def parse_profile_steps(text):
    """'START,END' -> (start, end) with 1 <= start <= end."""
    try:
        start, end = (int(v) for v in text.split(','))
    except ValueError:
        raise ValueError('--profile_steps=%s must be START,END, e.g. 10,15' % text)
    if not 1 <= start <= end:
        raise ValueError('--profile_steps=%s needs 1 <= START <= END' % text)
    return start, end


class NonFiniteLossError(UserError, RuntimeError):
    """The loss or the gradients stopped being finite; weights were left untouched."""


_LOSS_TERMS = ('cls_loss', 'box_loss', 'iou_loss', 'l2_loss')
DIVERGENCE_ADVICE = ('lower learning_rate, raise lr_warmup_epoch or set clip_gradients_norm '
                     '(--hparams), or check the data')


def non_finite_terms(record):
    """'cls_loss nan, box_loss inf' for the non-finite loss terms of a training log record
    (dict of TRAIN_LOG_KEYS -> float); the gradient norm when only the gradients are."""
    bad = ['%s %s' % (name, record[name]) for name in _LOSS_TERMS
           if name in record and not math.isfinite(record[name])]
    if not bad and not math.isfinite(record.get('grad_norm', 0.0)):
        bad = ['gradient norm %s' % record['grad_norm']]
    return ', '.join(bad) or 'the total loss'


def divergence_message(step, record, checkpoint):
    """The line of a run stopped at a non-finite loss at `step` (checkpoint: the last one
    written, all finite, or None)."""
    kept = ('the last finite checkpoint %s is kept' % os.path.basename(checkpoint)
            if checkpoint else 'no checkpoint was written')
    return ('loss became %s at step %d (non-finite: %s; learning rate %.4g); the update of '
            'that step was skipped and %s; %s' % (
                record.get('loss'), step, non_finite_terms(record),
                record.get('learning_rate', float('nan')), kept, DIVERGENCE_ADVICE))


class FiniteGuardHook(tf1.train.SessionRunHook):
    """Stops training with NonFiniteLossError at the first step whose loss or gradients are
    not finite, naming the loss term. The graph skipped that step's update, so the weights (and
    any checkpoint written later) are the last good ones. Passed to Estimator.train() so it runs
    before the Estimator's own NanTensorHook, which would only raise a bare traceback.
    model_dir: where rank 0's checkpoints are (None on other ranks)."""

    def __init__(self, model_dir=None):
        self._model_dir = model_dir

    def begin(self):
        self._finite, self._loss = tf1.get_collection(det_model_fn.FINITE_GUARD_COLLECTION)
        self._scalars = tf1.get_collection(det_model_fn.TRAIN_LOG_COLLECTION)
        self._step = tf1.train.get_global_step()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs([self._finite, self._step, self._scalars])

    def after_run(self, run_context, run_values):
        finite, step, scalars = run_values.results
        if not finite:
            record = dict(zip(det_model_fn.TRAIN_LOG_KEYS, (float(v) for v in scalars)))
            latest = checkpoints.latest_checkpoint(self._model_dir) if self._model_dir else None
            raise NonFiniteLossError(divergence_message(step + 1, record, latest))


class FiniteWeightsListener(tf1.train.CheckpointSaverListener):
    """Refuses to write a checkpoint whose weights are not all finite (a finite loss can
    still take a step to inf weights with a huge learning rate): raises NonFiniteLossError
    before the save, so the checkpoints on disk stay the last finite ones.
    model_dir: where the checkpoints are (rank 0's, the only one that saves)."""

    def __init__(self, model_dir):
        self._model_dir = model_dir

    def begin(self):
        floats = [v for v in tf1.global_variables() if v.dtype.base_dtype.is_floating]
        self._all_finite = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(v)) for v in floats]) if floats else tf.constant(True)

    def before_save(self, session, global_step_value):
        if session.run(self._all_finite):
            return
        latest = checkpoints.latest_checkpoint(self._model_dir)
        raise NonFiniteLossError(
            'the weights became non-finite at step %d with a finite loss; that checkpoint was '
            'not written and %s; %s' % (
                global_step_value, 'the last finite checkpoint %s is kept' %
                os.path.basename(latest) if latest else 'no checkpoint was written',
                DIVERGENCE_ADVICE))


class CheckpointHook(tf1.train.CheckpointSaverHook):
    """Estimator's checkpoint saver (the same saver, files and listeners: passed to
    Estimator.train() on rank 0, it replaces the one the Estimator would add), timed on the
    run's clock (engine/wall_time.py), and able to save the current step when asked
    (save_now: the checkpoint an evaluation inside the session reads)."""

    def __init__(self, model_dir, save_steps, save_graph_def, clock=None):
        super().__init__(model_dir, save_steps=save_steps, save_graph_def=save_graph_def)
        self._clock = clock

    def _save(self, session, step):
        with wall_time.phase(self._clock, wall_time.CHECKPOINTS):
            return super()._save(session, step)

    def save_now(self, session, step):
        """Writes the checkpoint of `step` (the session's current global step) unless this
        hook wrote it already; returns True when a listener asked training to stop."""
        if self._timer.last_triggered_step() == step:
            return False
        self._timer.update_last_triggered_step(step)
        return self._save(session, step)


def checkpoint_hook(run, clock=None):
    """Rank 0's CheckpointHook as the Estimator of `run` would make its saver hook (every
    --cp_every_n_steps); None on other ranks and with --cp_every_n_steps=0 (the Estimator adds
    no saver hook then either)."""
    config = run.estimator.config
    if not (distributed.is_main() and config.save_checkpoints_steps):
        return None
    return CheckpointHook(config.model_dir, config.save_checkpoints_steps,
                          config.checkpoint_save_graph_def, clock)


def make_training_hooks(run, stop_step, clock=None, evaluation=None, epoch=False):
    """The hooks of one Estimator.train() call of `run` (a setup.Run) that stops at
    `stop_step`; images/s count the global batch (all ranks and accumulated micro-batches).
    clock: the run's WallTime, whose StepTimeHook comes first. evaluation: the call's
    training_eval.EvaluationHook (not in the list: it comes after the saver), whose steps are
    TrainLogHook's pauses and follow an end --steps_file moves. epoch: the call trains one
    epoch of train_by_epochs (--steps_file only ends it sooner)."""
    options = run.options
    log_dir = setup.rank_log_dir(options)
    hooks = [wall_time.StepTimeHook(clock)] if clock is not None else []
    log = TrainLogHook(log_dir, run.settings.batch.global_size,
                       max(run.settings.schedule.total_steps, stop_step),
                       options.log_every_n_steps, write_files=log_dir is not None,
                       stop_step=stop_step,
                       pause_steps=evaluation.steps if evaluation is not None else ())
    hooks += [FiniteGuardHook(options.model_dir if distributed.is_main() else None),
              preemption.StopAtSignalHook(), log]
    path = run.settings.runtime.steps_file
    if path:  # Before the hooks that act at the stop step.
        def on_move(end, stop):
            log.retarget(end, stop, None if evaluation is None else evaluation.retarget(end))
        hooks.append(steps_file.StepsFileHook(path, stop_step, run.settings.schedule.total_steps,
                                              on_move, epoch))
    if log_dir is not None:
        hooks.append(SummaryHook(log_dir, options.iterations_per_loop))
    if options.profile_steps and distributed.is_main():
        start, end = parse_profile_steps(options.profile_steps)
        hooks.append(ProfilerWindowHook(start, end, os.path.join(options.model_dir, 'profile')))
    return hooks
