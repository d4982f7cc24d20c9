"""The training engine in one process: a real Run (engine/setup.prepare on fake training
data and a few real validation TFRecords) whose Estimator has a tiny model function instead of
the network, so loops, evaluation, hooks and preemption run in about a second per Estimator
call.

    with tiny_run(engine_options(tmp_path, val_pattern), TinyModel()) as run:
        loops.execute(run)

The tiny model has one trainable scalar, `shift`. Training moves it by gradient descent on
0.5 * (shift - target)^2; its exponential moving average (EMA) is kept as the real model keeps
it (checkpoints/checkpoints.py ema_*). Its detections are the ground-truth boxes each moved by
shift x the box's height down and shift x its width right (the EMA value, restored as the real
model restores it), so every detection has the IoU `shifted_iou(shift)` with its box and the
COCO AP is the share of the ten IoU thresholds that IoU reaches (`hand_ap`): the AP of a
checkpoint follows from its EMA value alone, and the training direction decides whether later
checkpoints score better or worse.

Plain helpers imported by the test modules; fixtures live in conftest.py and the test files.
"""
import collections
import contextlib
import dataclasses
import json
import logging
import os
import signal

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from cli_runs import TINY_HPARAMS
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.evaluation import coco_metric
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.engine import train_log as run_log
from efficientdet_hpu.engine import setup as run_setup
from tfrecord_fixtures import ImageSpec, write_shards

tf1 = tf.compat.v1

SHIFT = 'shift'
SHIFT_EMA = 'shift/' + checkpoints.EMA_NAME
# pycocotools' IoU thresholds (COCOeval Params.iouThrs), computed as it computes them.
IOU_THRESHOLDS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)

# Five validation images (two batches of 2 and one of 1 at --eval_batch_size=2), sides powers
# of two and boxes on whole pixels: the records' normalised boxes times the image size give
# the same pixels back exactly.
VAL_SPECS = (
    ImageSpec(image_id=11, height=64, width=64, boxes=[[8, 8, 40, 40]], labels=[1]),
    ImageSpec(image_id=12, height=64, width=128, boxes=[[4, 16, 36, 80], [40, 90, 60, 120]],
              labels=[2, 3]),
    ImageSpec(image_id=13, height=128, width=64, boxes=[[20, 4, 100, 60]], labels=[3]),
    ImageSpec(image_id=14, height=64, width=64, boxes=[[0, 0, 32, 32], [32, 32, 64, 64]],
              labels=[1, 2]),
    ImageSpec(image_id=15, height=128, width=128, boxes=[[16, 16, 112, 80]], labels=[2]),
)

# The tiny network's hparams (tests/cli_runs.py) with the validation data's three classes:
# what the input pipelines and model_dir/config.yaml see; the tiny model builds no network.
ENGINE_HPARAMS = TINY_HPARAMS + ',num_classes=3'


def write_val_shards(directory):
    """VAL_SPECS as one TFRecord file under directory; returns its glob pattern."""
    return write_shards(directory, VAL_SPECS, num_files=1, prefix='val')


def engine_options(model_dir, val_pattern, **values):
    """RunOptions of a train_and_eval run on fake training data: batch 2, 5 images an epoch
    (2.5 steps), 3 epochs (7 steps; epochs end at steps 2, 5 and 7), every step logged, no
    periodic checkpoint (only each train() call's first and last)."""
    fields = dict.fromkeys(RunOptions.names())
    fields.update(
        mode='train_and_eval', model_name='efficientdet-d0', model_dir=str(model_dir),
        hparams=ENGINE_HPARAMS, backbone_ckpt='', ckpt='', train_batch_size=2,
        eval_batch_size=2, eval_samples=0, training_file_pattern='',
        validation_file_pattern=val_pattern, val_json_file='', testdev_dir='',
        num_examples_per_epoch=5, num_epochs=3, iterations_per_loop=2, log_every_n_steps=1,
        cp_every_n_steps=1000, keep_checkpoint_max=20, save_graph_def=False,
        min_eval_interval=0, eval_timeout=1, eval_after_training=False, early_stop_patience=0,
        use_fake_data=True, use_amp=False, use_xla=False, deterministic=False, seed=1,
        no_hpu=True, benchmark=False, profile_steps='', skip_bad_records=False,
        dump_all_ranks=False, verbose=False)
    fields.update(values)
    return RunOptions.from_values(fields)


@contextlib.contextmanager
def tiny_run(options, model):
    """A Run prepared by run_setup.prepare from `options` whose Estimator calls
    model.model_fn; closed (the model_dir lock released) on leaving the block. Preemption's
    signal handlers and records are put back as they were too (`preemption_restored`)."""
    config = hparams_config.get_efficientdet_config(options.model_name).override(options.hparams)
    with preemption_restored():
        run = run_setup.prepare(options, config, set())
        try:
            estimator = tf1.estimator.Estimator(model.model_fn, config=run.estimator.config,
                                                params=run.settings)
            yield dataclasses.replace(run, estimator=estimator)
        finally:
            run.close()


@contextlib.contextmanager
def preemption_restored():
    """loops.execute installs preemption's handlers of the stop signals in this process, and
    preemption.py keeps the signal received and the step the ranks agreed on in module state:
    on leaving the block both are as they were, so the next run (or test) starts clean and
    the test process gets its own handlers back."""
    handlers = {number: signal.getsignal(number) for number in preemption.STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        # No public reset in preemption.py (the report proposes one).
        preemption._received.clear()  # pylint: disable=protected-access
        preemption._agreed.clear()  # pylint: disable=protected-access
        preemption._installed.clear()  # pylint: disable=protected-access


class SignalAtStep(tf1.train.SessionRunHook):
    """Sends `signum` to this process after training step `step` (1-based), as a job
    scheduler would; preemption's handler (installed by loops.execute) records it."""

    def __init__(self, step, signum):
        self._step, self._signum = step, signum

    def begin(self):
        self._global_step = tf1.train.get_global_step()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if run_values.results + 1 == self._step:
            # Without preemption's handler the signal would end the test process.
            assert signal.getsignal(self._signum) not in (signal.SIG_DFL, None)
            os.kill(os.getpid(), self._signum)


@dataclasses.dataclass
class TinyModel:
    """model_fn with det_model_fn.model_fn's contract for what the engine reads (the module
    docstring says what it computes).

    initial_shift, target_shift, learning_rate: the training of `shift` (gradient descent);
    nan_at_step: the 1-based step whose loss is NaN (FiniteGuardHook stops there);
    signal_at_step, signum: a SignalAtStep hook of the training;
    signal_in_evaluation_of: `signum` sent to this process while the checkpoint of that
    global step is evaluated (from its first prediction batch);
    prediction_hook: the PREDICT spec has a (do-nothing) prediction hook.
    builds counts the graphs built by mode (model_fn calls: 'train', 'infer')."""
    initial_shift: float = 0.4
    target_shift: float = 0.0
    learning_rate: float = 0.3
    nan_at_step: int = None
    signal_at_step: int = None
    signum: int = signal.SIGUSR2
    signal_in_evaluation_of: int = None
    prediction_hook: bool = False
    builds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    signals_sent: list = dataclasses.field(default_factory=list)

    def model_fn(self, features, labels, mode, params):
        del labels  # The tiny model learns from nothing but its target.
        self.builds[mode] += 1
        shift = tf1.get_variable(SHIFT, initializer=float(self.initial_shift))
        if mode == tf1.estimator.ModeKeys.TRAIN:
            return self._train_spec(features, shift, params)
        if mode == tf1.estimator.ModeKeys.PREDICT:
            return self._predict_spec(features, shift, params)
        raise ValueError('the tiny model has no %s mode' % mode)

    def _train_spec(self, images, shift, params):
        """images: float32 [batch, height, width, 3], read (times 0) so the input runs."""
        global_step = tf1.train.get_or_create_global_step()
        loss = 0.5 * tf.square(shift - self.target_shift) + 0.0 * tf.reduce_mean(images)
        if self.nan_at_step is not None:
            loss = tf.where(tf.equal(global_step, self.nan_at_step - 1),
                            tf.constant(np.nan, tf.float32), loss)
        optimizer = tf1.train.GradientDescentOptimizer(self.learning_rate)
        grads_and_vars = optimizer.compute_gradients(loss, [shift])
        grad_norm = tf.linalg.global_norm([grad for grad, _ in grads_and_vars])
        averaged = checkpoints.ema_variables()
        shadows = checkpoints.ema_shadows(averaged)

        # The hooks fetch the global step as the step before the update (hooks.TrainLogHook,
        # preemption.StopAtSignalHook), and the summary the shift before it; a graph this small
        # could otherwise run the update first. The real network's step takes long enough that the fetch wins in practice.
        # The update runs in a tf.cond on `finite`, hence after it.
        shift_before = tf.identity(shift)  # Summarised: the value before this step's update.
        with tf.control_dependencies([global_step.graph.as_graph_element(global_step),
                                      shift_before]):
            # As det_model_fn._train_op: a non-finite step changes nothing (FiniteGuardHook
            # then stops the training).
            finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(grad_norm))

        def apply():
            step = optimizer.apply_gradients(grads_and_vars, global_step)
            with tf.control_dependencies([step]):
                update = checkpoints.ema_update(averaged, shadows,
                                                params.config.moving_average_decay, global_step)
            with tf.control_dependencies([update]):
                return tf.constant(True)
        train_op = tf.cond(finite, apply, lambda: tf.constant(False))
        zero = tf.constant(0.0)
        logged = dict(loss=loss, cls_loss=loss, box_loss=zero, iou_loss=zero, l2_loss=zero,
                      learning_rate=tf.constant(self.learning_rate, tf.float32),
                      grad_norm=grad_norm)
        tf1.summary.scalar('train/shift', shift_before)
        tf1.add_to_collection(det_model_fn.FINITE_GUARD_COLLECTION, finite)
        tf1.add_to_collection(det_model_fn.FINITE_GUARD_COLLECTION, loss)
        for name in det_model_fn.TRAIN_LOG_KEYS:
            tf1.add_to_collection(det_model_fn.TRAIN_LOG_COLLECTION, logged[name])
        hooks = ([SignalAtStep(self.signal_at_step, self.signum)]
                 if self.signal_at_step is not None else [])
        return tf1.estimator.EstimatorSpec(tf1.estimator.ModeKeys.TRAIN, loss=loss,
                                           train_op=train_op, training_hooks=hooks)

    def _predict_spec(self, features, shift, params):
        """features['groundtruth_data']: float32 [batch, K, 7] rows [ymin, xmin, ymax, xmax,
        is_crowd, area, label] in original pixels, real rows first, padding -1."""
        groundtruth = features['groundtruth_data']
        if self.signal_in_evaluation_of is not None:
            groundtruth = self._signalling(groundtruth)
        detections, num_detections = shifted_detections(
            tf.cast(features['source_ids'], tf.float32), groundtruth, shift)
        predictions = {'detections': detections, 'num_detections': num_detections}
        predictions.update({key: features[key] for key in det_model_fn.PREDICT_PASSTHROUGH
                            if key in features})
        # The real model's PREDICT restore: the EMA values into the model variables.
        scaffold = tf1.train.Scaffold(saver=checkpoints.ema_restore_saver(
            params.config.moving_average_decay, sharded=True))
        hooks = [tf1.train.SessionRunHook()] if self.prediction_hook else None
        return tf1.estimator.EstimatorSpec(tf1.estimator.ModeKeys.PREDICT,
                                           predictions=predictions, scaffold=scaffold,
                                           prediction_hooks=hooks)

    def _signalling(self, groundtruth):
        """groundtruth, read after a Python function that sends `signum` to this process
        when the restored global step is signal_in_evaluation_of (the first batch)."""
        def send(step):
            if step == self.signal_in_evaluation_of and not self.signals_sent:
                self.signals_sent.append(int(step))
                os.kill(os.getpid(), self.signum)
            return step
        sent = tf1.numpy_function(send, [tf1.train.get_global_step()], tf.int64)
        with tf.control_dependencies([sent]):
            return tf.identity(groundtruth)


def shifted_detections(image_ids, groundtruth, shift):
    """Detection rows [image_id, ymin, xmin, ymax, xmax, score, label] [batch, K, 7] of the
    ground-truth rows moved by shift x (height, width), scores 1, 0.99, 0.98, ... in row
    order, and the real rows per image int32 [batch], as tensors (inputs: tensors or NumPy).

    image_ids: [batch]; groundtruth: [batch, K, 7] as _predict_spec's."""
    boxes, labels = groundtruth[..., :4], groundtruth[..., 6:7]
    sizes = tf.concat([boxes[..., 2:4] - boxes[..., 0:2]] * 2, axis=-1)
    moved = boxes + tf.cast(shift, boxes.dtype) * sizes
    count = tf.shape(groundtruth)[1]
    scores = 1.0 - 0.01 * tf.cast(tf.range(count), boxes.dtype)
    ones = tf.ones_like(labels)
    detections = tf.concat([tf.cast(image_ids, boxes.dtype)[:, None, None] * ones, moved,
                            scores[None, :, None] * ones, labels], axis=-1)
    num_detections = tf.reduce_sum(tf.cast(labels[..., 0] > 0, tf.int32), axis=1)
    return detections, num_detections


def shifted_iou(shift):
    """IoU of a box with itself moved by shift x its height down and x its width right."""
    overlap = (1.0 - abs(shift)) ** 2
    return overlap / (2.0 - overlap)


def hand_ap(shift):
    """COCO AP of detections that all have IoU shifted_iou(shift) with their box, one each,
    ranked above nothing else: 1 at each threshold that IoU reaches, 0 at the others."""
    return float(np.mean(shifted_iou(shift) >= IOU_THRESHOLDS))


def groundtruth_arrays(specs, max_instances):
    """(image ids int64 [N], float64 [N, max_instances, 7] ground-truth rows of `specs`)."""
    rows = np.full([len(specs), max_instances, 7], -1.0)
    for index, spec in enumerate(specs):
        for row, (box, label) in enumerate(zip(spec.boxes, spec.labels)):
            ymin, xmin, ymax, xmax = box
            rows[index, row] = [ymin, xmin, ymax, xmax, 0, (ymax - ymin) * (xmax - xmin), label]
    return np.array([spec.image_id for spec in specs], np.int64), rows


def direct_metrics(checkpoint, specs=VAL_SPECS, max_instances=100):
    """coco_metric's metrics of the tiny model's detections of `specs` at `checkpoint`,
    computed here with NumPy from the checkpoint's EMA value of `shift` (no Estimator)."""
    shift = tf.train.load_variable(checkpoint, SHIFT_EMA)
    image_ids, groundtruth = groundtruth_arrays(specs, max_instances)
    detections, counts = shifted_detections(image_ids, groundtruth.astype(np.float32),
                                            np.float32(shift))
    rows = np.concatenate([d[:n] for d, n in zip(detections.numpy(), counts.numpy())])
    metric = coco_metric.EvaluationMetric()
    metric.update_state(image_ids, rows, groundtruth)
    return metric.evaluate()


def ema_shift(checkpoint):
    return float(tf.train.load_variable(checkpoint, SHIFT_EMA))


def checkpoint_steps(model_dir):
    """Steps of the checkpoints model_dir lists, oldest first."""
    state = tf.train.get_checkpoint_state(str(model_dir))
    paths = state.all_model_checkpoint_paths if state else []
    return [checkpoints.checkpoint_step(path) for path in paths]


def logged_steps(model_dir, event):
    """Steps of model_dir's JSON log records of `event` ('train', 'eval', ...), in order."""
    return [record['step'] for record in run_log.read_json_log(str(model_dir))
            if record['event'] == event]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def log_lines():
    """Collects the messages the library logs (absl, INFO and above) in the block: yields
    the list they are appended to."""
    # absl sets its logger's level from --verbosity (WARNING) when its handler is first
    # installed, as run_setup.prepare does: installed first, the level set here holds.
    absl_logging.use_absl_handler()
    logger = logging.getLogger('absl')
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def read_metrics(model_dir, step):
    """The metrics of model_dir/eval/metrics-<step>.json."""
    with open(os.path.join(str(model_dir), 'eval', 'metrics-%d.json' % step)) as f:
        return json.load(f)['metrics']


def best_record(model_dir):
    """model_dir/best/best_eval.json (engine/checkpoint_eval.keep_best)."""
    with open(os.path.join(str(model_dir), 'best', 'best_eval.json')) as f:
        return json.load(f)
