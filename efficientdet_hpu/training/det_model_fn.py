"""TPUEstimator-style `model_fn(features, labels, mode, params)` for tf.compat.v1.estimator.

TRAIN: focal + box loss, L2 weight decay, momentum SGD on a warm-up + cosine (or step) schedule
scaled with the global batch, gradient clipping, an exponential moving average of the weights;
with params.batch.accumulation_steps = K > 1 each rank's batch is K micro-batches whose
gradients are summed before the one allreduce and update of the step
(training/accumulation.py).
EVAL: the losses of the EMA weights. PREDICT: detections of the EMA weights in original image
pixels (what COCO evaluation and export consume).

`params` is the run's finalised configuration, a config/settings.Settings (the Estimator's
params): params.config (the frozen hparams Config), params.batch, params.schedule (steps and the
scaled learning rate) and params.runtime (compute dtype, warm starts). model_fn derives none of
them itself.
"""
import functools
import math
import re

import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import gradient_clipping
from efficientdet_hpu.ops import losses
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.training import accumulation
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.training import loss_scale
from efficientdet_hpu.training import var_freeze
from efficientdet_hpu.checkpoints import warm_start
from efficientdet_hpu.core import run_end
from efficientdet_hpu.training import steps_file

tf1 = tf.compat.v1

# Images, ids, scales and ground truth travel as features in PREDICT mode (Estimator.predict
# drops labels), so evaluation can gather everything it needs from the predictions.
PREDICT_PASSTHROUGH = ('source_ids', 'image_scales', 'image_sizes', 'groundtruth_data')
# Scalars the training log reads, in this order, from the graph collection of that name.
TRAIN_LOG_COLLECTION = 'train_log_scalars'
# [finite (bool), total loss]: read by engine.hooks.FiniteGuardHook.
FINITE_GUARD_COLLECTION = 'finite_guard'
TRAIN_LOG_KEYS = ('loss', 'cls_loss', 'box_loss', 'iou_loss', 'l2_loss', 'learning_rate',
                  'grad_norm')
_L2_VARIABLE_RE = re.compile(r'.*(kernel|weights):0$')


def learning_rate_schedule(global_step, *, base_rate, warmup_init, warmup_steps, total_steps,
                           decay_method='cosine', first_drop_step=0, second_drop_step=0,
                           cosine_from_warmup_end=False):
    """google/automl's schedules (its det_model_fn.py), step for step.

    A linear warm-up from warmup_init to base_rate over warmup_steps (none if 0), then
      cosine: 0.5 * base_rate * (1 + cos(pi * step / (total_steps - warmup_steps))), automl's
        formula: the cosine counts from step 0, not from the warm-up's end, and is not held
        after total_steps (the paper's recipes were trained with it); with
        cosine_from_warmup_end, 0.5 * base_rate * (1 + cos(pi * p)), p = (step - warmup_steps)
        / (total_steps - warmup_steps) held in [0, 1]: from the warm-up's end down to 0;
      stepwise: base_rate, times 0.1 from first_drop_step on, 0.01 from second_drop_step on;
      constant: base_rate from step 0 (automl warms nothing up there).

    Args:
      global_step: int64 scalar tensor.
      base_rate, warmup_init: floats, already scaled for the global batch.
      warmup_steps, total_steps, first_drop_step, second_drop_step: ints; for the cosine,
        warmup_steps and total_steps may be float32 tensors (--steps_file's variables).
    Returns: float32 scalar tensor.
    """
    step = tf.cast(global_step, tf.float32)
    if decay_method == 'constant':
        return tf.constant(base_rate, tf.float32) + 0.0 * step
    moving = not isinstance(warmup_steps, (int, float))  # --steps_file's variables.
    warmup = tf.cast(warmup_steps if moving else int(warmup_steps), tf.float32)
    if decay_method == 'cosine':
        decay_span = tf.maximum(tf.cast(total_steps, tf.float32) - warmup, 1.0)
        progress = step / decay_span
        if cosine_from_warmup_end:
            progress = tf.clip_by_value((step - warmup) / decay_span, 0.0, 1.0)
        decayed = 0.5 * base_rate * (1.0 + tf.cos(math.pi * progress))
    else:
        decayed = tf.constant(base_rate, tf.float32) + 0.0 * step
        for multiplier, start in ((0.1, first_drop_step), (0.01, second_drop_step)):
            decayed = tf.where(step < float(start), decayed, base_rate * multiplier)
    if not moving and int(warmup_steps) <= 0:
        return decayed
    warmup_rate = warmup_init + step / tf.maximum(warmup, 1.0) * (base_rate - warmup_init)
    if decay_method == 'stepwise':
        # automl's order: a drop that falls inside the warm-up wins over it.
        warmup_rate = tf.where(step < float(first_drop_step), warmup_rate, decayed)
    return tf.where(step < warmup, warmup_rate, decayed)


def learning_rate_of_run(global_step, params, moving=None):
    """The run's schedule, every step count and rate as config/settings.finalize made them
    (moving: --steps_file's variables, which hold the warm-up's and the run's steps)."""
    schedule, config = params.schedule, params.config
    moving = moving if config.lr_decay_method == 'cosine' else None  # The others: no end.
    return learning_rate_schedule(
        global_step, base_rate=schedule.learning_rate, warmup_init=schedule.warmup_init,
        warmup_steps=moving[run_end.WARMUP_STEPS] if moving else schedule.warmup_steps,
        total_steps=moving[run_end.TOTAL_STEPS] if moving else schedule.total_steps,
        decay_method=config.lr_decay_method, first_drop_step=schedule.first_drop_step,
        second_drop_step=schedule.second_drop_step,
        cosine_from_warmup_end=config.cosine_from_warmup_end)


def cosine_rise_warning(settings):
    """One line when automl's cosine (counted from step 0) reaches 0 before the last step and
    climbs back above 1% of its peak by the end: a warm-up that is a large part of a short run
    (automl's 1 epoch in 300 rises by 3e-5). None otherwise."""
    config, schedule = settings.config, settings.schedule
    if config.lr_decay_method != 'cosine' or config.cosine_from_warmup_end:
        return None
    warmup, total_steps = schedule.warmup_steps, schedule.total_steps
    span = max(total_steps - warmup, 1)
    final = 0.5 * (1.0 + math.cos(math.pi * total_steps / span))
    if warmup <= 0 or final < 0.01:
        return None
    return ('learning rate: automl\'s cosine (counted from step 0) reaches 0 at step %d and '
            'rises back to %.0f%% of its peak by step %d, as the warm-up (%d steps) is %.0f%% of '
            'the run; set cosine_from_warmup_end=true for a cosine from the warm-up\'s end to 0'
            % (span, 100 * final, total_steps, warmup, 100.0 * warmup / total_steps))


def _build_network(features, params, is_training):
    """The network in params.runtime.compute_dtype when training; EVAL and PREDICT compute in
    float32 (as Habana's port evaluates): the checkpoint's weights are float32, and AP is
    then the same whether or not the run trained with mixed precision."""
    images = features['images'] if isinstance(features, dict) else features
    allreduce = distributed.allreduce_mean if params.runtime.cross_rank_batch_norm else None
    return efficientdet_arch.build_model(
        images, params.config, is_training=is_training, allreduce_mean_fn=allreduce,
        compute_dtype=params.runtime.compute_dtype if is_training else 'float32')


def _anchor_boxes(params):
    height, width = hparams_config.parse_image_size(params.config.image_size)
    return anchors.generate_anchor_boxes(height, width,
                                         **hparams_config.anchor_settings(params.config))


def _detection_losses(class_outputs, box_outputs, labels, params, normalizer):
    config = params.config
    levels = range(config.min_level, config.max_level + 1)
    return losses.detection_loss(
        class_outputs, box_outputs,
        {l: labels['cls_targets_%d' % l] for l in levels},
        {l: labels['box_targets_%d' % l] for l in levels},
        labels['num_positives'],
        normalizer=normalizer,
        num_classes=config.num_classes,
        anchors_per_location=hparams_config.anchors_per_location(config),
        alpha=config.alpha, gamma=config.gamma, delta=config.delta,
        box_loss_weight=config.box_loss_weight, label_smoothing=config.label_smoothing,
        iou_loss_type=config.iou_loss_type, iou_loss_weight=config.iou_loss_weight,
        anchor_boxes=_anchor_boxes(params) if config.iou_loss_type != 'none' else None)


def positives_normalizer(num_positives, momentum):
    """The loss normaliser as automl's detection_loss makes it from `positives_momentum`.

    num_positives: float32 [batch], positive anchors per image of this rank's whole step
    (every micro-batch). momentum 0: the step's count + 1 (each rank its own, as automl per
    replica); > 0: a moving average of that (automl's variable `moving_normalizer`, from 0, no
    bias correction); < 0: the same normaliser on every rank, the mean over ranks of the count
    plus 1 / ranks, so that with the gradients averaged over ranks a step's gradient is that
    of (loss sum over the global batch) / (its positives + 1): N ranks and K micro-batches give
    one process's step on the concatenated batch."""
    count = tf.reduce_sum(tf.cast(num_positives, tf.float32))
    if momentum < 0:
        return distributed.allreduce_mean(count) + 1.0 / distributed.size()
    normalizer = count + 1.0
    if momentum > 0:
        moving = tf1.get_variable('moving_normalizer', [], tf.float32, trainable=False,
                                  initializer=tf1.zeros_initializer())
        return moving.assign_sub((moving - normalizer) * (1.0 - momentum))
    return normalizer


def _step_normalizer(labels, params, training=True):
    """positives_normalizer of a step's labels (all micro-batches); evaluation never keeps a
    moving normaliser (a checkpoint trained without one must evaluate)."""
    momentum = params.config.positives_momentum
    return positives_normalizer(labels['num_positives'],
                                momentum if training else min(momentum, 0.0))


def _weight_decay_loss(weight_decay):
    kernels = [v for v in tf1.trainable_variables() if _L2_VARIABLE_RE.match(v.name)]
    if not kernels or weight_decay <= 0:
        return tf.constant(0.0)
    return weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in kernels])


def _optimizer(params, learning_rate):
    if params.config.optimizer == 'adam':
        optimizer = tf1.train.AdamOptimizer(learning_rate)
    else:
        optimizer = tf1.train.MomentumOptimizer(learning_rate, momentum=params.config.momentum)
    return optimizer  # Gradients are averaged over ranks in _train_op, once per step.


def _train_op(total_loss, params, learning_rate, micro_batches=(), micro_batch_loss=None,
              ema_decay=None):
    """Gradients (summed over micro-batches, then averaged across ranks), clipping, a
    finite-guarded update and the EMA.

    total_loss: the step's (first micro-batch's) loss; micro_batches: the step's further
    micro-batches and micro_batch_loss(micro-batch) -> its loss, built one after the other
    (training/accumulation.py).
    Returns (train_op, gradient norm, keep_going): keep_going is False when the step was
    skipped for a non-finite loss or gradients (training stops there), but not for a float16
    overflow the dynamic loss scale absorbs (training/loss_scale.py: skip, halve, go on)."""
    global_step = tf1.train.get_or_create_global_step()
    optimizer = _optimizer(params, learning_rate)
    config = params.config
    freeze_steps = config.var_freeze_steps
    var_freeze.check_schedule(config.var_freeze_expr, freeze_steps,
                              config.var_freeze_lr_multiplier, config.optimizer)
    if freeze_steps:  # Frozen for the first phase only: they stay in the list.
        variables = tf1.trainable_variables()
        phased = var_freeze.phased(variables, config.var_freeze_expr, freeze_steps)
    else:
        variables = var_freeze.trainable(tf1.trainable_variables(), config.var_freeze_expr)
    scaler = (loss_scale.DynamicLossScale() if params.runtime.compute_dtype == 'float16'
              else None)
    total_loss, grads = accumulation.sum_gradients(
        total_loss, micro_batches, micro_batch_loss, variables,
        scaler.scale_loss if scaler else None)
    grads = distributed.allreduce_gradients(grads)  # One allreduce per optimizer step.
    grads = scaler.unscale(grads) if scaler else [tf.cast(g, tf.float32) for g in grads]
    if freeze_steps:
        grads = var_freeze.zero_until(grads, phased, freeze_steps, global_step)
    global_norm = tf.linalg.global_norm(grads)
    grads, applied_norm = gradient_clipping.clip_gradients(
        grads, params.config.clip_gradients_norm, global_norm=global_norm,
        per_variable=params.config.clip_gradients_per_variable)
    if freeze_steps:
        grads = var_freeze.scale(grads, phased, config.var_freeze_lr_multiplier)
    # The log's grad_norm is before clipping; automl's `gradient_norm` summary after it.
    tf1.summary.scalar('train/gradient_norm', applied_norm)
    # The averaged gradients are identical on every rank, so every rank takes the same branch.
    grads_finite = tf.math.is_finite(global_norm)
    finite = tf.logical_and(grads_finite, tf.math.is_finite(total_loss))
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    averaged = checkpoints.ema_variables()
    shadows = checkpoints.ema_shadows(averaged)

    def apply():
        with tf.control_dependencies(update_ops):
            step = optimizer.apply_gradients(list(zip(grads, variables)), global_step)
        with tf.control_dependencies([step]):
            return checkpoints.ema_update(
                averaged, shadows, params.config.moving_average_decay if ema_decay is None
                else ema_decay, global_step)

    train_op = tf.cond(finite, lambda: _as_bool(apply()), lambda: tf.constant(False))
    if scaler is None:
        return train_op, global_norm, finite
    # Read the scale's state before this step's update moves it.
    keep_going = tf.logical_and(tf.math.is_finite(total_loss),
                                tf.logical_or(grads_finite, tf.logical_not(scaler.exhausted())))
    with tf.control_dependencies([train_op, keep_going]):
        train_op = tf.logical_and(train_op, scaler.update(grads_finite))
    return train_op, global_norm, keep_going


def _as_bool(op):
    with tf.control_dependencies([op]):
        return tf.constant(True)


def _ema_scaffold(params):
    """A Scaffold whose saver loads the EMA shadow values into the model variables."""
    return tf1.train.Scaffold(saver=checkpoints.ema_restore_saver(
        params.config.moving_average_decay, sharded=True))


def _predict_spec(features, class_outputs, box_outputs, params):
    height, width = hparams_config.parse_image_size(params.config.image_size)
    batch = tf.shape(features['images'])[0]
    image_ids = features.get('source_ids', tf.zeros([batch], tf.int64))
    scales = features.get('image_scales', tf.ones([batch], tf.float32))
    sizes = features.get('image_sizes', tf.tile([[height, width]], [batch, 1]))
    detections, num_detections = postprocess.generate_detections(
        class_outputs, box_outputs, _anchor_boxes(params), image_ids, scales, sizes,
        num_classes=params.config.num_classes, **hparams_config.nms_settings(params.config))
    predictions = {'detections': detections, 'num_detections': num_detections}
    for key in PREDICT_PASSTHROUGH:
        if key in features:
            predictions[key] = features[key]
    return tf1.estimator.EstimatorSpec(
        tf1.estimator.ModeKeys.PREDICT, predictions=predictions, scaffold=_ema_scaffold(params))


def model_fn(features, labels, mode, params):
    """Estimator model_fn; `params`: a config/settings.Settings (the module docstring)."""
    if mode == tf1.estimator.ModeKeys.TRAIN:
        return _train_spec(features, labels, params)
    class_outputs, box_outputs = _build_network(features, params, is_training=False)
    if mode == tf1.estimator.ModeKeys.PREDICT:
        return _predict_spec(features, class_outputs, box_outputs, params)

    loss_terms = _detection_losses(class_outputs, box_outputs, labels, params,
                                   _step_normalizer(labels, params, training=False))
    total_loss = loss_terms['total_loss'] + _weight_decay_loss(params.config.weight_decay)
    metrics = {'eval/' + k: tf1.metrics.mean(v) for k, v in loss_terms.items()}
    return tf1.estimator.EstimatorSpec(mode, loss=total_loss, eval_metric_ops=metrics,
                                       scaffold=_ema_scaffold(params))


def _micro_batch_loss(batch, params, normalizer, terms, reuse=False):
    """Builds the network on one micro-batch (features, labels) and returns its loss (a float32
    scalar: its share of the step's loss, `normalizer` being the whole step's); appends its
    loss terms to `terms`. reuse: the variables exist (a further micro-batch)."""
    features, labels = batch
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=True if reuse else None):
        class_outputs, box_outputs = _build_network(features, params, is_training=True)
    terms.append(_detection_losses(class_outputs, box_outputs, labels, params, normalizer))
    return terms[-1]['total_loss']


def _train_spec(features, labels, params):
    """TRAIN: one optimizer step over params.batch.accumulation_steps micro-batches of this
    rank's batch (features images [K x b, H, W, 3], labels likewise)."""
    micro_batches = accumulation.split_micro_batches(
        (features, labels), params.batch.accumulation_steps)
    normalizer, terms = _step_normalizer(labels, params), []
    # The first network is built here: warm starts and optimizer state need its variables.
    first_loss = _micro_batch_loss(micro_batches[0], params, normalizer, terms)
    l2_loss = _weight_decay_loss(params.config.weight_decay)  # Once per step.
    global_step = tf1.train.get_or_create_global_step()
    moving = None
    if params.runtime.steps_file:  # The end may move while the run trains.
        moving = steps_file.schedule_variables({
            run_end.TOTAL_STEPS: params.schedule.total_steps,
            run_end.WARMUP_STEPS: params.schedule.warmup_steps,
            run_end.EMA_DECAY: params.config.moving_average_decay})
    learning_rate = learning_rate_of_run(global_step, params, moving)
    warm_start.apply(params.runtime)
    train_op, grad_norm, finite = _train_op(
        first_loss + l2_loss, params, learning_rate, micro_batches[1:], functools.partial(
            _micro_batch_loss, params=params, normalizer=normalizer, terms=terms, reuse=True),
        moving[run_end.EMA_DECAY] if moving else None)
    # The step's loss terms: sums over micro-batches (each already divided by the step's
    # normalizer), as one batch of K x b images would give them.
    loss_terms = {key: tf.add_n([t[key] for t in terms]) for key in terms[0]}
    total_loss = loss_terms['total_loss'] + l2_loss
    logged = dict(loss_terms, l2_loss=l2_loss, loss=total_loss, learning_rate=learning_rate,
                  grad_norm=grad_norm)
    for name, value in logged.items():
        tf1.summary.scalar('train/' + name, value)
    tf1.add_to_collection(FINITE_GUARD_COLLECTION, finite)
    tf1.add_to_collection(FINITE_GUARD_COLLECTION, total_loss)
    for name in TRAIN_LOG_KEYS:
        tf1.add_to_collection(TRAIN_LOG_COLLECTION, tf.cast(logged[name], tf.float32))
    return tf1.estimator.EstimatorSpec(
        tf1.estimator.ModeKeys.TRAIN, loss=total_loss, train_op=train_op,
        scaffold=_train_scaffold(),
        training_hooks=distributed.broadcast_hook())


def _train_scaffold():
    """The default Scaffold without its readiness checks: report_uninitialized_variables over
    every variable, built and run twice at session creation (seconds for D0), wait for another
    task to initialise shared variables. Every rank here initialises or restores all of its
    own (a checkpoint missing a variable fails its restore)."""
    ready = tf.constant([], tf.string, name='all_variables_ready')
    return tf1.train.Scaffold(ready_op=ready, ready_for_local_init_op=ready)
