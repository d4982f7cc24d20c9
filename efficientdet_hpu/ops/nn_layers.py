"""Graph-mode building blocks: convolutions, batch norm (local or synchronous), activations,
drop-connect and the mixed-precision variable getter.

Every function takes plain keyword arguments (never a config) and creates its variables with
tf.compat.v1.get_variable under a variable scope named after the layer, using the names the
TF EfficientNet/EfficientDet checkpoints use: `kernel`, `depthwise_kernel`, `pointwise_kernel`,
`bias`, and `gamma` / `beta` / `moving_mean` / `moving_variance`. Weight decay selects
variables by `kernel` in the name, so these names are part of the training contract.

Tensors are NHWC. Convolution weights are requested in the dtype of their input, so under
`precision_custom_getter` a bfloat16/float16 layer reads a cast of a float32 master variable.
Batch-norm variables and statistics are always float32.
"""
import math

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

HALF_DTYPES = (tf.bfloat16, tf.float16)


def precision_custom_getter(getter, name, *args, **kwargs):
    """Variable getter that keeps float32 master weights for half-precision layers.

    A request for a bfloat16/float16 variable creates (or reuses) a float32 variable and
    returns a cast of it, so gradients and checkpoints stay float32.
    Use: tf.compat.v1.variable_scope(scope, custom_getter=precision_custom_getter).
    """
    requested = tf.as_dtype(kwargs.get('dtype') or tf.float32)
    if requested not in HALF_DTYPES:
        return getter(name, *args, **kwargs)
    kwargs['dtype'] = tf.float32
    variable = getter(name, *args, **kwargs)
    return tf.cast(variable, requested)


def activation(features, act_type):
    """Applies 'swish' | 'relu' | 'relu6'; None returns `features` unchanged."""
    if act_type is None:
        return features
    if act_type == 'swish':
        return tf.nn.silu(features)
    if act_type == 'relu':
        return tf.nn.relu(features)
    if act_type == 'relu6':
        return tf.nn.relu6(features)
    raise ValueError("act_type=%r is not one of 'swish', 'relu', 'relu6'" % (act_type,))


def efficientnet_conv_initializer(shape, dtype=tf.float32, partition_info=None):
    """Normal(0, sqrt(2 / fan_out)), fan_out = kh * kw * out_channels (EfficientNet's choice).

    For a depthwise kernel [kh, kw, channels, 1] the 'out_channels' factor is the multiplier 1.
    """
    del partition_info
    fan_out = int(shape[0] * shape[1] * shape[-1])
    return tf.random.normal(shape, stddev=math.sqrt(2.0 / fan_out), dtype=dtype)


def _check_nhwc(inputs, layer):
    if inputs.shape.rank != 4:
        raise ValueError('%s expects an NHWC tensor of rank 4, got shape %s'
                         % (layer, inputs.shape))
    return int(inputs.shape[-1])


def _add_bias(outputs, filters, use_bias, bias_initializer):
    if not use_bias:
        return outputs
    bias = tf1.get_variable('bias', [filters], dtype=outputs.dtype,
                            initializer=bias_initializer or tf1.zeros_initializer())
    return tf.nn.bias_add(outputs, bias)


def conv2d(inputs, filters, kernel_size, strides=1, use_bias=False, kernel_initializer=None,
           bias_initializer=None, name='conv2d'):
    """'same'-padded convolution. inputs [B, H, W, Cin] -> [B, H/s, W/s, filters], same dtype.

    Variables: `<name>/kernel` [k, k, Cin, filters] (+ `<name>/bias` [filters]).
    Default kernel initializer: Glorot uniform (the tf.layers default).
    """
    in_channels = _check_nhwc(inputs, 'conv2d %s' % name)
    with tf1.variable_scope(name):
        kernel = tf1.get_variable(
            'kernel', [kernel_size, kernel_size, in_channels, filters], dtype=inputs.dtype,
            initializer=kernel_initializer or tf1.glorot_uniform_initializer())
        outputs = tf.nn.conv2d(inputs, kernel, strides=[1, strides, strides, 1], padding='SAME')
        return _add_bias(outputs, filters, use_bias, bias_initializer)


def depthwise_conv2d(inputs, kernel_size, strides=1, kernel_initializer=None,
                     name='depthwise_conv2d'):
    """'same'-padded depthwise convolution (multiplier 1), no bias.

    inputs [B, H, W, C] -> [B, H/s, W/s, C]. Variable: `<name>/depthwise_kernel` [k, k, C, 1].
    """
    channels = _check_nhwc(inputs, 'depthwise_conv2d %s' % name)
    with tf1.variable_scope(name):
        kernel = tf1.get_variable(
            'depthwise_kernel', [kernel_size, kernel_size, channels, 1], dtype=inputs.dtype,
            initializer=kernel_initializer or tf1.glorot_uniform_initializer())
        return tf.nn.depthwise_conv2d(inputs, kernel, strides=[1, strides, strides, 1],
                                      padding='SAME')


def separable_conv2d(inputs, filters, kernel_size=3, use_bias=True, depthwise_initializer=None,
                     pointwise_initializer=None, bias_initializer=None, name='separable_conv2d'):
    """Depthwise k x k (multiplier 1) then pointwise 1x1, 'same' padding, stride 1.

    inputs [B, H, W, Cin] -> [B, H, W, filters], same dtype. Variables under `<name>/`:
    `depthwise_kernel` [k, k, Cin, 1], `pointwise_kernel` [1, 1, Cin, filters], `bias`.
    """
    in_channels = _check_nhwc(inputs, 'separable_conv2d %s' % name)
    with tf1.variable_scope(name):
        depthwise = tf1.get_variable(
            'depthwise_kernel', [kernel_size, kernel_size, in_channels, 1], dtype=inputs.dtype,
            initializer=depthwise_initializer or tf1.glorot_uniform_initializer())
        pointwise = tf1.get_variable(
            'pointwise_kernel', [1, 1, in_channels, filters], dtype=inputs.dtype,
            initializer=pointwise_initializer or tf1.glorot_uniform_initializer())
        outputs = tf.nn.separable_conv2d(inputs, depthwise, pointwise, strides=[1, 1, 1, 1],
                                         padding='SAME')
        return _add_bias(outputs, filters, use_bias, bias_initializer)


def _batch_norm_variables(channels, gamma_initializer):
    gamma = tf1.get_variable('gamma', [channels], tf.float32, initializer=gamma_initializer)
    beta = tf1.get_variable('beta', [channels], tf.float32, initializer=tf1.zeros_initializer())
    moving_mean = tf1.get_variable('moving_mean', [channels], tf.float32,
                                   initializer=tf1.zeros_initializer(), trainable=False)
    moving_variance = tf1.get_variable('moving_variance', [channels], tf.float32,
                                       initializer=tf1.ones_initializer(), trainable=False)
    return gamma, beta, moving_mean, moving_variance


def _synchronized_moments(inputs, allreduce_mean_fn):
    """Mean and (biased) variance over the global batch, float32 [C] each.

    Each rank contributes E[x] and E[x^2] of its shard (one allreduce of a [2C] vector);
    Var = E[x^2] - E[x]^2. Assumes every rank holds the same number of pixels.
    """
    values = tf.cast(inputs, tf.float32)
    mean = tf.reduce_mean(values, axis=[0, 1, 2])
    mean_of_square = tf.reduce_mean(tf.square(values), axis=[0, 1, 2])
    both = allreduce_mean_fn(tf.concat([mean, mean_of_square], axis=0))
    mean, mean_of_square = tf.split(tf.cast(both, tf.float32), 2)
    return mean, tf.nn.relu(mean_of_square - tf.square(mean))


def _normalize_with(inputs, mean, variance, gamma, beta, epsilon):
    scale = gamma * tf.math.rsqrt(variance + epsilon)
    offset = beta - mean * scale
    return inputs * tf.cast(scale, inputs.dtype) + tf.cast(offset, inputs.dtype)


def _add_moving_average_updates(moving_mean, moving_variance, mean, variance, momentum):
    # moving <- momentum * moving + (1 - momentum) * batch, written as a single assign_sub.
    for variable, value in ((moving_mean, mean), (moving_variance, variance)):
        delta = (variable - tf.stop_gradient(value)) * (1.0 - momentum)
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, tf1.assign_sub(variable, delta))


def batch_norm(inputs, is_training, momentum=0.99, epsilon=1e-3, act_type=None,
               allreduce_mean_fn=None, init_zero=False, name='batch_normalization'):
    """Batch norm over [B, H, W] per channel, then an optional activation.

    Args:
      inputs: [B, H, W, C] float32/bfloat16/float16; the output has the same shape and dtype.
      is_training: Python bool. True normalises with batch statistics and adds the moving-
        average updates to tf.compat.v1.GraphKeys.UPDATE_OPS; False uses the moving averages.
      momentum, epsilon: moving-average decay and variance epsilon.
      act_type: None or an `activation` name applied after normalisation.
      allreduce_mean_fn: None (statistics of the local batch) or f(float32 [N]) -> float32
        [N], the mean over workers; then batch statistics are synchronised across workers.
      init_zero: initialise gamma to 0 instead of 1.
    Variables (float32 [C]) under `<name>/`: trainable gamma, beta; non-trainable
    moving_mean, moving_variance.
    """
    channels = _check_nhwc(inputs, 'batch_norm %s' % name)
    gamma_initializer = tf1.zeros_initializer() if init_zero else tf1.ones_initializer()
    with tf1.variable_scope(name):
        gamma, beta, moving_mean, moving_variance = _batch_norm_variables(
            channels, gamma_initializer)
        if not is_training and inputs.dtype == tf.float32:
            # One multiply-add, not the fused kernel: with constant (exported) weights
            # grappler folds it into the convolution before it and fuses the swish after it,
            # which it does not do for a depthwise conv + FusedBatchNorm: D0 batch-1
            # inference measured ~8% faster on CPU (paired A/B, 135 -> 125 ms).
            outputs = _normalize_with(inputs, moving_mean, moving_variance, gamma, beta,
                                      epsilon)
        elif not is_training:
            # bfloat16/float16: the fused kernel normalises in float32.
            outputs, _, _ = tf1.nn.fused_batch_norm(
                inputs, gamma, beta, mean=moving_mean, variance=moving_variance,
                epsilon=epsilon, is_training=False)
        elif allreduce_mean_fn is not None:
            # Moving variance gets the biased global variance here (the rank count is unknown).
            mean, variance = _synchronized_moments(inputs, allreduce_mean_fn)
            outputs = _normalize_with(inputs, mean, variance, gamma, beta, epsilon)
            _add_moving_average_updates(moving_mean, moving_variance, mean, variance, momentum)
        else:
            # The fused kernel normalises with the biased variance and returns the unbiased
            # one for the moving average, as tf.keras BatchNormalization does.
            outputs, mean, variance = tf1.nn.fused_batch_norm(
                inputs, gamma, beta, epsilon=epsilon, is_training=True)
            _add_moving_average_updates(moving_mean, moving_variance, mean, variance, momentum)
    return activation(outputs, act_type)


def drop_connect(inputs, is_training, survival_prob):
    """Stochastic depth: zeroes whole examples with probability 1 - survival_prob.

    inputs [B, ...]; kept examples are scaled by 1 / survival_prob. Identity when not
    training or when survival_prob is None, <= 0 or >= 1 (<= 0 means "off", as in the
    reference EfficientDet, which passes 0.0 to disable it).
    """
    if not is_training or not survival_prob or survival_prob <= 0 or survival_prob >= 1:
        return inputs
    batch_size = tf.shape(inputs)[0]
    noise_shape = tf.concat([[batch_size], tf.ones([inputs.shape.rank - 1], tf.int32)], 0)
    keep = tf.floor(survival_prob + tf.random.uniform(noise_shape, dtype=tf.float32))
    return inputs * tf.cast(keep / survival_prob, inputs.dtype)


def max_pool(inputs, pool_size, strides):
    """'same'-padded max pool. inputs [B, H, W, C]; pool_size, strides: (h, w) ints."""
    return tf.nn.max_pool2d(inputs, ksize=[1, pool_size[0], pool_size[1], 1],
                            strides=[1, strides[0], strides[1], 1], padding='SAME')


def upsample_nearest(inputs, factor_h, factor_w):
    """Nearest-neighbour upsampling by integer factors. [B, H, W, C] -> [B, H*fh, W*fw, C].

    Done with broadcast + reshape, so it is exact in every dtype and keeps static shapes.
    The unit axes come from a reshape, not from indexing with None: that would be a 6-D
    strided slice, which TFLite's builtin ops cannot run (serving/tflite_export.py).
    """
    _, height, width, channels = inputs.shape.as_list()
    target = tf.concat([tf.shape(inputs)[:1],
                        [height, factor_h, width, factor_w, channels]], axis=0)
    expanded = tf.reshape(inputs, [-1, height, 1, width, 1, channels])
    tiled = tf.broadcast_to(expanded, target)
    return tf.reshape(tiled, [-1, height * factor_h, width * factor_w, channels])


def prior_probability_bias(prior=0.01):
    """Bias initializer making sigmoid(bias) = prior (focal-loss classification heads)."""
    return tf1.constant_initializer(-np.log((1.0 - prior) / prior))
