"""EfficientNet layers: stem, MBConv block with squeeze-excitation, and the feature extractor.

Layer order (Tan & Le 2019; MobileNetV2 inverted residual + SE):
  stem:   3x3/2 conv -> BN -> act
  MBConv: [1x1 expand conv -> BN -> act] (if expand_ratio != 1) -> kxk/s depthwise -> BN ->
          act -> SE -> 1x1 project conv -> BN -> [drop-connect -> + input] (if stride 1 and
          filters in == out)
  SE:     global mean -> 1x1 conv (max(1, int(input_filters * se_ratio)), bias) -> act ->
          1x1 conv (expanded filters, bias) -> sigmoid -> * input
Variable names follow the public TF EfficientNet checkpoints (`<model>/blocks_3/conv2d/kernel`,
`.../tpu_batch_normalization_1/gamma`, `.../se/conv2d_1/bias`), so those checkpoints restore
into this backbone by name.
"""
import tensorflow as tf

from efficientdet_hpu.ops import nn_layers

tf1 = tf.compat.v1

_BN = 'tpu_batch_normalization'


def _numbered(base, index):
    return base if index == 0 else '%s_%d' % (base, index)


def stem(images, filters, norm_fn, act_type):
    """[B, H, W, 3] -> [B, H/2, W/2, filters]."""
    with tf1.variable_scope('stem'):
        features = nn_layers.conv2d(
            images, filters, 3, strides=2,
            kernel_initializer=nn_layers.efficientnet_conv_initializer)
        return norm_fn(features, name=_BN, act_type=act_type)


def squeeze_excite(inputs, reduced_filters, act_type):
    """Channel attention. inputs [B, H, W, C] -> same shape and dtype."""
    channels = int(inputs.shape[-1])
    with tf1.variable_scope('se'):
        squeezed = tf.reduce_mean(inputs, axis=[1, 2], keepdims=True)
        squeezed = nn_layers.conv2d(
            squeezed, reduced_filters, 1, use_bias=True,
            kernel_initializer=nn_layers.efficientnet_conv_initializer, name='conv2d')
        squeezed = nn_layers.activation(squeezed, act_type)
        excited = nn_layers.conv2d(
            squeezed, channels, 1, use_bias=True,
            kernel_initializer=nn_layers.efficientnet_conv_initializer, name='conv2d_1')
        return tf.sigmoid(excited) * inputs


def mbconv_block(inputs, block, norm_fn, act_type, is_training, survival_prob):
    """One mobile inverted bottleneck.

    Args:
      inputs: [B, H, W, block.input_filters].
      block: efficientnet_builder.BlockArgs (strides an int).
      norm_fn: f(x, name, act_type=None) -> x.
      survival_prob: drop-connect keep probability of this block (None: off).
    Returns: [B, H / strides, W / strides, block.output_filters], dtype of inputs.
    """
    conv_index, bn_index = 0, 0
    features = inputs
    if block.expand_ratio != 1:
        features = nn_layers.conv2d(
            features, block.input_filters * block.expand_ratio, 1,
            kernel_initializer=nn_layers.efficientnet_conv_initializer, name='conv2d')
        features = norm_fn(features, name=_BN, act_type=act_type)
        conv_index, bn_index = 1, 1
    features = nn_layers.depthwise_conv2d(
        features, block.kernel_size, strides=block.strides,
        kernel_initializer=nn_layers.efficientnet_conv_initializer)
    features = norm_fn(features, name=_numbered(_BN, bn_index), act_type=act_type)
    if block.se_ratio:
        reduced = max(1, int(block.input_filters * block.se_ratio))
        features = squeeze_excite(features, reduced, act_type)
    features = nn_layers.conv2d(
        features, block.output_filters, 1,
        kernel_initializer=nn_layers.efficientnet_conv_initializer,
        name=_numbered('conv2d', conv_index))
    features = norm_fn(features, name=_numbered(_BN, bn_index + 1), act_type=None)
    if block.id_skip and block.strides == 1 and block.input_filters == block.output_filters:
        features = nn_layers.drop_connect(features, is_training, survival_prob)
        features = features + inputs
    return features


def block_survival_prob(survival_prob, block_index, num_blocks):
    """Keep probability decays linearly from 1 (first block) towards survival_prob."""
    if not survival_prob:
        return None
    return 1.0 - (1.0 - survival_prob) * float(block_index) / num_blocks


def efficientnet_features(images, blocks, stem_filters, norm_fn, act_type, is_training,
                          survival_prob, name):
    """Stem and MBConv blocks under variable scope `name`; returns {level: feature map}.

    Args:
      images: [B, H, W, 3]. blocks: list of BlockArgs, one per block.
    Returns:
      {1..5: [B, H / 2**level, W / 2**level, C]}: the output of the last block before each
      stride-2 block (and of the last block), i.e. strides 2, 4, 8, 16, 32.
    """
    if images.shape.rank != 4 or images.shape[-1] != 3:
        raise ValueError('backbone expects images [B, H, W, 3], got shape %s' % images.shape)
    endpoints = {}
    with tf1.variable_scope(name):
        features = stem(images, stem_filters, norm_fn, act_type)
        for index, block in enumerate(blocks):
            with tf1.variable_scope('blocks_%d' % index):
                features = mbconv_block(
                    features, block, norm_fn, act_type, is_training,
                    block_survival_prob(survival_prob, index, len(blocks)))
            if index == len(blocks) - 1 or blocks[index + 1].strides > 1:
                endpoints[len(endpoints) + 1] = features
    return endpoints


def classifier_head(features, head_filters, num_classes, norm_fn, act_type):
    """EfficientNet's ImageNet classifier, which EfficientDet does not build: 1x1 conv ->
    BN -> act -> global mean -> dense (no dropout: inference only). Variables under scope
    'head' ('head/conv2d/kernel', 'head/tpu_batch_normalization/*', 'head/dense/{kernel,bias}'),
    the TF EfficientNet names; call it inside the backbone's variable scope.

    features: [B, h, w, C], the last block's output. Returns float32 logits [B, num_classes].
    """
    with tf1.variable_scope('head'):
        features = nn_layers.conv2d(features, head_filters, 1,
                                    kernel_initializer=nn_layers.efficientnet_conv_initializer)
        features = norm_fn(features, name=_BN, act_type=act_type)
        pooled = tf.reduce_mean(features, axis=[1, 2])
        with tf1.variable_scope('dense'):
            kernel = tf1.get_variable('kernel', [head_filters, num_classes], tf.float32)
            bias = tf1.get_variable('bias', [num_classes], tf.float32, tf1.zeros_initializer())
        return tf.matmul(tf.cast(pooled, tf.float32), kernel) + bias
