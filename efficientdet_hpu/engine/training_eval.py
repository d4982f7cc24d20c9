"""train_and_eval's evaluations inside the training session: one Estimator.train() call to the
final step, and at each evaluation step a session hook evaluates that step's checkpoint with
an evaluation graph and session built once per run and kept.

Why: with a train() call per epoch and an Estimator.predict() per evaluation, every cycle
built the training graph and session again (and restored the checkpoint), and the evaluation
graph before each evaluation: Lite0 at 320 px with an evaluation every 50 steps spent 24-25 s
of CPU a cycle on it on a 2-core VM (`bench.py train_and_eval`, docs/benchmarks.md).

What an evaluation does is unchanged (engine/checkpoint_eval.evaluate_checkpoint): every rank
predicts its shard with the checkpoint's EMA weights, rank 0 gathers and scores, writes the
metrics files and the JSON log record, keeps the best checkpoint and writes the error analysis.
Only the predictions come from the kept graph: the run's model_fn in PREDICT mode over the
same input_fn, whose scaffold's saver (the EMA restore, as Estimator.predict uses it) loads
each checkpoint into the kept session; the input iterator starts again each time.
"""
import threading

import tensorflow as tf
from absl import logging

from efficientdet_hpu.core import run_end
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.engine import checkpoint_eval
from efficientdet_hpu.engine import early_stop
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.engine import wall_time

tf1 = tf.compat.v1


class Evaluator:
    """The PREDICT graph of the run's model_fn over this rank's validation shard, built once
    (as Estimator.predict builds it: the config's graph seed, a global step, the input_fn on
    the CPU, an initialisable iterator), and one session for the run, opened at the first
    evaluation. Close it (close(), or `with`) when the run ends."""

    def __init__(self, run):
        self._run = run
        self._session = None
        estimator = run.estimator
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.random.set_random_seed(estimator.config.tf_random_seed)
            tf1.train.get_or_create_global_step()
            with tf.device('/cpu:0'):
                dataset = checkpoint_eval.eval_input_fn(run)(estimator.params)
            self._iterator = tf1.data.make_initializable_iterator(dataset)
            spec = estimator.model_fn(self._iterator.get_next(), None,
                                      tf1.estimator.ModeKeys.PREDICT, estimator.config)
            self.prediction_hooks = list(spec.prediction_hooks or ())
            self._predictions = spec.predictions
            spec.scaffold.finalize()
            self._saver, self._local_init = spec.scaffold.saver, spec.scaffold.local_init_op
        self.graph.finalize()  # Evaluations add nothing to it.

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def close(self):
        if self._session is not None:
            self._session.close()
            self._session = None

    def _opened_session(self):
        if self._session is None:
            self._session = tf1.Session(graph=self.graph,
                                        config=self._run.estimator.config.session_config)
        return self._session

    def batches(self, checkpoint):
        """Yields the prediction batches (dicts of arrays) of this rank's shard with
        `checkpoint`'s weights as the model_fn's scaffold restores them (the EMA values)."""
        session = self._opened_session()
        with self.graph.as_default():  # The Saver restores eagerly otherwise.
            self._saver.restore(session, checkpoint)
            session.run(self._local_init)
            session.run(self._iterator.initializer)
        while True:
            try:
                with self.graph.as_default():
                    batch = session.run(self._predictions)
            except tf.errors.OutOfRangeError:
                return
            yield batch

    def predict(self, run, checkpoint, shown=None):
        """checkpoint_eval.predict_shard's result, from the kept graph."""
        return checkpoint_eval.collect_shard(run, self.batches(checkpoint), shown)


def blocker(run, evaluator):
    """Why this run cannot evaluate inside the training session (it then trains one epoch per
    train() call and evaluates with Estimator.predict), or None; rank 0's answer on every
    rank (a collective: the ranks must take the same path)."""
    reason = None
    if (run.options.cp_every_n_steps or 0) <= 0:
        reason = ('--cp_every_n_steps=%s: no checkpoint saver to write the evaluation steps\' '
                  'checkpoints' % run.options.cp_every_n_steps)
    elif evaluator.prediction_hooks:
        reason = ('the model_fn\'s PREDICT spec has prediction_hooks, which an evaluation in '
                  'a kept session would not run')
    return distributed.broadcast_object(reason)


class EvaluationHook(tf1.train.SessionRunHook):
    """At each of the steps `steps_for(the run's last step)` gives (global steps; the last
    step --steps_file's when it holds one, and again when it moves: `retarget`): rank 0 writes
    that step's checkpoint
    (`saver`, its hooks.CheckpointHook; None on the other ranks), every rank waits for its
    name and all evaluate it with `evaluator` (checkpoint_eval.evaluate_checkpoint). Then a
    stop signal any rank received meanwhile ends the training after this step as one during
    a step does (preemption.py), and so does early stopping (engine/early_stop.py), before
    the final step. After a step at which the ranks agreed to stop on a signal nothing is
    evaluated (the run stops there, as before)."""

    def __init__(self, run, evaluator, steps_for, saver=None, clock=None):
        self._run, self._evaluator, self._saver, self._clock = run, evaluator, saver, clock
        self._steps_for = steps_for
        self.retarget(run_end.target_steps(run.settings.runtime.steps_file,
                                           run.settings.schedule.total_steps))

    @property
    def steps(self):
        return tuple(self._steps)

    def retarget(self, last_step):
        """The run now ends at `last_step`; returns the steps evaluated at from now on."""
        self._steps = sorted(set(self._steps_for(last_step)))
        return self.steps

    def begin(self):
        self._global_step = tf1.train.get_global_step()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if int(run_values.results) + 1 not in self._steps or preemption.stop_agreed():
            return
        step = int(run_context.session.run(self._global_step))  # After the update.
        with wall_time.phase(self._clock, wall_time.EVALUATIONS):
            checkpoint = self._checkpoint_of(run_context.session, step)
            in_own_thread(checkpoint_eval.evaluate_checkpoint, self._run, checkpoint,
                          self._evaluator.predict)
            if preemption.agree_to_stop_at(step) or (
                    step < self._steps[-1] and early_stop.reached(self._run)):
                run_context.request_stop()

    def _checkpoint_of(self, session, step):
        """Rank 0 writes the checkpoint of `step` (unless its periodic save just did); every
        rank gets its name (the broadcast is the wait)."""
        name = None
        if self._saver is not None:
            self._saver.save_now(session, step)
            name = checkpoints.latest_checkpoint(self._run.options.model_dir)
        name = distributed.broadcast_object(name)
        if name is None or checkpoints.checkpoint_step(name) != step:
            raise RuntimeError('the checkpoint of step %d to evaluate was not written (newest: '
                               '%s)' % (step, name))
        return name


def in_own_thread(function, *args):
    """function(*args) run in a thread of its own while this one waits; returns its value or
    raises its exception. A session hook runs in the training graph's context (graph mode,
    that finalised graph the default); there TensorFlow's context is the process's own (eager,
    no default graph), the one evaluation code expects and a top-level evaluation has (it
    reads the records' ids with tf.data, writes summaries in graphs of its own)."""
    outcome = {}

    def target():
        try:
            outcome['value'] = function(*args)
        except BaseException as error:  # pylint: disable=broad-except
            outcome['error'] = error
    thread = threading.Thread(target=target, name='efficientdet:evaluation', daemon=True)
    thread.start()
    thread.join()
    if 'error' in outcome:
        raise outcome['error']
    return outcome.get('value')


def log_fallback(reason):
    logging.info('train_and_eval evaluates epoch by epoch (a train() call per epoch, '
                 'Estimator.predict per evaluation): %s', reason)


def describe(steps):
    """'evaluations at steps 50, 100, 150 and 200, in the training session'."""
    steps = [str(step) for step in steps]
    listed = steps[0] if len(steps) == 1 else '%s and %s' % (', '.join(steps[:-1]), steps[-1])
    return 'evaluations at step%s %s, in the training session' % (
        '' if len(steps) == 1 else 's', listed)
