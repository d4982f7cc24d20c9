"""--steps_file: a run's end moved, earlier or later, while it trains, without a restart.

Another process (efficientdet-finetune, once its first steps' rate shows the planned steps do
not fit its time budget) writes the record of core/run_end.py,
    {"total_steps": N, "warmup_steps": W, "moving_average_decay": d},
and the run, at its next step, ends at step N instead: its warm-up and cosine follow W and N
(the cosine reaches 0 at N), its weights' moving average the new decay and its evaluations the
epochs up to N (`on_move`), as a run planned so from the start would go on from that step, and
as a restart with that plan would, without the restart's start-up. The frozen backbone's steps
are not moved (the writer moves the end once they are over).

N at a step already passed is clamped to the next step, and said. Where the call evaluates at
its last step (train_and_eval), the file is read again once that evaluation is over
(`settle_hook`), so an end moved later while the run evaluated its last step still moves it.
A train() call that stops
before the run's end (an epoch of train_by_epochs) stops at N only when N comes sooner. One
process only (main.py refuses the flag with more ranks: the ranks would read the file at
different steps). The values live in local variables (not in checkpoints): a resumed run
starts from its recipe, which the writer updates with the file.
"""
import os

from absl import logging
import tensorflow as tf
import tensorflow.compat.v1 as tf1

from efficientdet_hpu.core.run_end import EMA_DECAY, TOTAL_STEPS, WARMUP_STEPS, read

COLLECTION = 'steps_file_targets'


def schedule_variables(planned):
    """{name: float32 local variable} for `planned` {TOTAL_STEPS, WARMUP_STEPS, EMA_DECAY:
    the plan's value}, which the hook assigns; the model_fn's learning rate and moving
    average read them in place of the planned constants."""
    return {name: tf1.get_variable('steps_file/' + name,
                                   initializer=tf.constant(float(value), tf.float32),
                                   trainable=False,
                                   collections=[tf1.GraphKeys.LOCAL_VARIABLES, COLLECTION])
            for name, value in planned.items()}


# Estimator.train's max_steps where the file may move the end later: the hook stops the call.
NO_LIMIT = 2 ** 62


class StepsFileHook(tf1.train.SessionRunHook):
    """Reads the file after every step (a stat; it is read only when it changed) and ends the
    train() call at its step. `planned_end`: the run's last step as planned (the variables'
    values at the start). `epoch`: the call trains one epoch (train_by_epochs), so it stops at
    the file's step only when that comes before `stop_step`. `on_move(end, stop_step)`: told
    the run's new end and this call's stop (the progress line's ETA and the evaluations follow
    them)."""

    def __init__(self, path, stop_step, planned_end=None, on_move=None, epoch=False):
        self._path, self._stop_step, self._on_move = path, stop_step, on_move
        self._end = stop_step if planned_end is None else planned_end  # The variables' value.
        self._call_stop = stop_step if epoch else None
        self._seen = None
        self._settles, self._step = False, None

    def begin(self):
        variables = {v.op.name.split('/')[-1]: v for v in tf1.get_collection(COLLECTION)}
        self._global_step = tf1.train.get_global_step()
        self._feeds = {name: tf1.placeholder(tf.float32, (), name='steps_file_' + name)
                       for name in variables}
        self._assign = {name: variables[name].assign(self._feeds[name]) for name in variables}

    def after_create_session(self, session, coord):
        del coord
        self._apply(session, session.run(self._global_step))  # Written before the start.

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = int(run_values.results) + 1  # The value fetched is from before the update.
        self._apply(run_context.session, step)
        self._step = step
        if step >= self._stop_step and not self._settles:
            run_context.request_stop()

    def settle_hook(self):
        """A hook to place after the hooks that evaluate at the stop step: the file read again
        there, and the call stopped only then (this hook no longer stops it itself)."""
        self._settles = True
        return _SettleHook(self)

    def settle(self, run_context):
        """After the stop step's evaluation: the file's end, if it moved meanwhile, followed;
        the call stopped where the step is still the end."""
        self._apply(run_context.session, self._step)
        if self._step >= self._stop_step:
            run_context.request_stop()

    def _apply(self, session, step):
        try:
            stat = os.stat(self._path)
        except OSError:
            return
        key = (stat.st_mtime_ns, stat.st_size)
        if key == self._seen:
            return
        record = read(self._path)
        if record is None:  # Not whole yet (or not ours): looked at again next step.
            return
        self._seen = key
        asked = record[TOTAL_STEPS]
        end = max(asked, step)
        if end == self._end:
            return
        values = {TOTAL_STEPS: float(end), WARMUP_STEPS: record[WARMUP_STEPS],
                  EMA_DECAY: record[EMA_DECAY]}
        values = {name: value for name, value in values.items()
                  if value is not None and name in self._assign}
        session.run([self._assign[name] for name in values],
                    {self._feeds[name]: value for name, value in values.items()})
        logging.info('%s: the run now ends at step %d (was %d)%s%s', self._path, end, self._end,
                     '' if end == asked else ' (asked %d: a step already reached)' % asked,
                     ''.join('; %s %g' % (name, record[name]) for name in (
                         WARMUP_STEPS, EMA_DECAY) if record[name] is not None))
        self._end = end
        self._stop_step = end if self._call_stop is None else min(end, self._call_stop)
        if self._on_move is not None:
            self._on_move(end, self._stop_step)


class _SettleHook(tf1.train.SessionRunHook):
    """StepsFileHook.settle after each step, from its place after the evaluation's hook."""

    def __init__(self, steps_hook):
        self._steps_hook = steps_hook

    def after_run(self, run_context, run_values):
        del run_values
        self._steps_hook.settle(run_context)
