"""Checkpoints of a run: finding them, the step a path names, and restoring the exponential
moving average (EMA) weights that evaluation, export and prediction use."""
import os
import re

import tensorflow as tf

from efficientdet_hpu.core.errors import UserError

tf1 = tf.compat.v1

EMA_NAME = 'ExponentialMovingAverage'  # tf.train.ExponentialMovingAverage's default name.
_STEP_RE = re.compile(r'-(\d+)$')


class CheckpointError(UserError, ValueError):
    """A checkpoint path that names no checkpoint; the message says what to pass."""


def checkpoint_step(path):
    """'.../model.ckpt-1600' -> 1600 (the global step the Estimator saved it at); a name
    without -STEP (google/automl's released checkpoints: '.../model') -> its global_step."""
    match = _STEP_RE.search(path or '')
    if match:
        return int(match.group(1))
    try:
        return int(tf.train.load_variable(path, 'global_step'))
    except (tf.errors.OpError, ValueError):
        raise CheckpointError('%s does not end in -STEP (e.g. model.ckpt-1000) and holds no '
                              'global_step' % path) from None


def latest_checkpoint(model_dir):
    """The newest checkpoint prefix in model_dir, or None."""
    if not model_dir or not tf.io.gfile.isdir(model_dir):
        return None
    return tf.train.latest_checkpoint(model_dir)


def has_checkpoint(model_dir):
    return latest_checkpoint(model_dir) is not None


def resolve_checkpoint(path, flag):
    """A checkpoint prefix from a prefix or from a directory holding checkpoints (its latest).

    flag: the option that named `path`, for the message ('ckpt', 'checkpoint', ...)."""
    if tf.io.gfile.isdir(path):
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError('--%s=%s is a directory without a checkpoint' % (flag, path))
        return latest
    if not tf.io.gfile.exists(path + '.index'):
        raise CheckpointError(
            '--%s=%s: no checkpoint there (expected %s.index); pass a checkpoint prefix such '
            'as %s/model.ckpt-1000 or a directory' % (flag, path, path,
                                                      os.path.dirname(path) or 'model_dir'))
    return path


def ema_variables():
    """Trainable variables plus batch-norm moving statistics: what the EMA tracks."""
    moving = [v for v in tf1.global_variables()
              if v.name.split('/')[-1].startswith(('moving_mean', 'moving_variance'))]
    return list(tf1.trainable_variables()) + moving


def ema_shadows(variables):
    """A non-trainable shadow of each variable, named as tf.train.ExponentialMovingAverage
    names it (`<variable>/ExponentialMovingAverage`) and starting from the variable's initial
    value (a warm start's restored value: init_from_checkpoint replaces it). TensorFlow's EMA
    reads that value through a tf.cond per variable, about 13 s of graph building for D0."""
    return [tf1.get_variable('%s/%s' % (variable.op.name, EMA_NAME), trainable=False,
                             initializer=variable.initial_value) for variable in variables]


def ema_update(variables, shadows, decay, num_updates):
    """tf.train.ExponentialMovingAverage(decay, num_updates).apply's update, op for op:
    rate = min(decay, (1 + n) / (10 + n)); shadow -= (shadow - variable) * (1 - rate)."""
    with tf.name_scope(EMA_NAME):
        steps = tf.cast(num_updates, tf.float32)
        rate = tf.minimum(tf.cast(decay, tf.float32), (1.0 + steps) / (10.0 + steps))
        step_size = 1.0 - rate  # One op for all variables (TensorFlow's EMA makes one each).
        updates = [shadow.assign_sub((shadow - variable) * tf.cast(step_size, shadow.dtype))
                   for variable, shadow in zip(variables, shadows)]
        return tf.group(*updates)


def ema_restore_saver(decay, sharded=False):
    """A Saver that loads a checkpoint's EMA shadow values into the graph's model variables
    (the model variables themselves where the checkpoint has no shadow)."""
    ema = tf1.train.ExponentialMovingAverage(decay)
    return tf1.train.Saver(ema.variables_to_restore(ema_variables()), sharded=sharded)
