"""Dynamic loss scaling for float16 training (`--use_amp` on GPU), as TensorFlow's
LossScaleOptimizer and NVIDIA's EfficientDet port do it.

float16 gradients of small losses underflow to zero, so the loss is multiplied by a scale
before differentiation and the gradients divided by it after. A fixed scale must be chosen
for the worst step; a dynamic one adapts: a step whose scaled gradients overflow (inf/NaN) is
skipped and the scale halved, and after `growth_interval` finite steps in a row the scale
doubles. The scale and the count are variables, checkpointed with the model, so a resumed run
continues with the scale it had. bfloat16 (CPU, HPU) has float32's exponent range and needs
none of this.
"""
import tensorflow as tf

tf1 = tf.compat.v1

INITIAL_SCALE = 2.0 ** 15
GROWTH_INTERVAL = 2000
MIN_SCALE = 1.0


class DynamicLossScale:
    """The scale state and its update; build inside the training graph."""

    def __init__(self, initial_scale=INITIAL_SCALE, growth_interval=GROWTH_INTERVAL):
        self.growth_interval = int(growth_interval)
        with tf1.variable_scope('loss_scale'):
            self.scale = tf1.get_variable('scale', initializer=float(initial_scale),
                                          trainable=False)
            self.good_steps = tf1.get_variable('good_steps', initializer=tf.constant(0, tf.int64),
                                               trainable=False)

    def scale_loss(self, loss):
        return loss * tf.cast(self.scale, loss.dtype)

    def unscale(self, gradients):
        """float32 gradients of the true loss (None kept for variables without one)."""
        return [None if g is None else tf.cast(g, tf.float32) / self.scale for g in gradients]

    def update(self, gradients_finite):
        """An op: grow the scale after growth_interval finite steps; on an overflow halve it
        (not under MIN_SCALE) and restart the count."""
        def finite_step():
            grow = self.good_steps + 1 >= self.growth_interval
            return _done(self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale)),
                         self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64),
                                                         self.good_steps + 1)))

        def overflow():
            return _done(self.scale.assign(tf.maximum(self.scale * 0.5, MIN_SCALE)),
                         self.good_steps.assign(tf.constant(0, tf.int64)))
        return tf.cond(gradients_finite, finite_step, overflow)

    def exhausted(self):
        """True once the scale is at its floor: an overflow then is the model's, not the
        scale's, and training should stop as for a non-finite loss."""
        return self.scale <= MIN_SCALE


def _done(*ops):
    with tf.control_dependencies(ops):
        return tf.constant(True)
