"""EfficientDet network (Tan, Pang, Le, CVPR 2020): EfficientNet backbone, extra pyramid levels,
repeated weighted BiFPN cells, and class / box heads shared across levels.

`build_model` is the factory: it is the only function here that reads the config. It returns
raw per-level outputs (docs/CONTRACTS.md); anchors, losses and decoding live elsewhere.

Variable scopes (named as in the google/automl TF1 EfficientDet / EfficientNet code: an automl
D0 checkpoint restores by name, tests/serving/test_automl_equivalence.py):
  efficientnet-bN/ (or -liteN/)...            backbone (restored alone by --backbone_ckpt)
  resample_p6/{conv2d,bn}/...                 extra levels above the backbone's P5
  fpn_cells/cell_<r>/fnode<i>/...             BiFPN nodes (resample_*, WSM*, op_after_combine*)
  class_net/class-<i>/...                     class head convs, shared by every level
  class_net/class-<i>-bn-<level>/...          class head batch norm, one per level
  class_net/class-predict/...                 class head output layer (depends on num_classes)
  box_net/box-<i>/, box-<i>-bn-<level>/, box-predict/   the same for the box head
"""
import functools

import tensorflow as tf

from efficientdet_hpu.backbone import efficientnet_builder
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.network import fpn_configs
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import nn_layers

tf1 = tf.compat.v1

COMPUTE_DTYPES = ('float32', 'bfloat16', 'float16')


def resolve_compute_dtype(compute_dtype):
    """The dtype layers compute in: float32, or a half type (what config/settings.finalize
    chose from mixed_precision and the device; the network reads no other precision field)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError('compute_dtype=%r is not one of %s' % (compute_dtype, COMPUTE_DTYPES))
    return tf.as_dtype(compute_dtype)


def feature_sizes(height, width, min_level, max_level):
    """{level: (h, w)} for min_level..max_level: anchors.level_shapes (exact halving up to
    level 5, rounding up above, as google/automl)."""
    return anchors.level_shapes(height, width, min_level, max_level)


def _check_images(images, height, width, image_size):
    shape = images.shape
    if shape.rank != 4 or shape[-1] != 3:
        raise ValueError('images must be [batch, height, width, 3], got shape %s' % shape)
    if (shape[1], shape[2]) != (height, width):
        raise ValueError('images are %sx%s (height x width) but config.image_size=%s means '
                         '%dx%d; resize the input or set image_size' % (
                             shape[1], shape[2], image_size, height, width))


def _project_channels(features, channels, norm_fn, apply_bn):
    """1x1 conv (+ BN, no activation) when the channel count differs."""
    if int(features.shape[-1]) == channels:
        return features
    features = nn_layers.conv2d(features, channels, 1, use_bias=True, name='conv2d')
    return norm_fn(features, name='bn') if apply_bn else features


def resample_feature_map(features, name, target_size, channels, norm_fn, apply_bn=True,
                         conv_after_downsample=False):
    """Resizes [B, H, W, C] to [B, th, tw, channels] under scope `resample_<name>`.

    Downsampling: max pool (kernel stride + 1, 'same'), with the 1x1 projection before it
    (or after, if conv_after_downsample). Upsampling: projection, then nearest neighbour.
    Upsampling by a non-integer factor (levels above 5 of an image size that is not a multiple
    of 2**max_level, e.g. 3 -> 5) resizes nearest-neighbour as automl: source index
    floor(target index * source / target).
    """
    _, height, width, _ = features.shape.as_list()
    target_height, target_width = target_size
    with tf1.variable_scope('resample_%s' % name):
        if height > target_height and width > target_width:
            if not conv_after_downsample:
                features = _project_channels(features, channels, norm_fn, apply_bn)
            stride_h = (height - 1) // target_height + 1
            stride_w = (width - 1) // target_width + 1
            features = nn_layers.max_pool(features, (stride_h + 1, stride_w + 1),
                                          (stride_h, stride_w))
            if conv_after_downsample:
                features = _project_channels(features, channels, norm_fn, apply_bn)
        elif height <= target_height and width <= target_width:
            features = _project_channels(features, channels, norm_fn, apply_bn)
            if target_height % height or target_width % width:
                features = tf1.image.resize_nearest_neighbor(
                    features, [target_height, target_width])
            elif (height, width) != (target_height, target_width):
                features = nn_layers.upsample_nearest(
                    features, target_height // height, target_width // width)
        else:
            raise ValueError('cannot resample %dx%d to %dx%d' % (
                height, width, target_height, target_width))
    return features


def _numbered(base, index):
    return base if index == 0 else '%s_%d' % (base, index)


def fuse_features(nodes, weight_method):
    """Combines same-shape tensors: 'sum', 'attn' (softmax weights) or 'fastattn'
    (relu(w_i) / (sum_j relu(w_j) + 1e-4)). Scalar float32 weights `WSM`, `WSM_1`, ... start
    at 1.0 and are applied in the nodes' dtype."""
    if weight_method == 'sum':
        return tf.add_n(nodes)
    weights = tf.stack([
        tf1.get_variable(_numbered('WSM', i), [], tf.float32, tf1.ones_initializer())
        for i in range(len(nodes))])
    if weight_method == 'attn':
        normalized = tf.nn.softmax(weights)
    elif weight_method == 'fastattn':
        weights = tf.nn.relu(weights)
        normalized = weights / (tf.reduce_sum(weights) + 1e-4)
    else:
        raise ValueError("fpn_weight_method=%r is not one of 'fastattn', 'attn', 'sum'"
                         % (weight_method,))
    normalized = tf.cast(normalized, nodes[0].dtype)
    return tf.add_n([node * normalized[i] for i, node in enumerate(nodes)])


def _combine_op(features, num_filters, norm_fn, act_type, separable_conv, conv_bn_act_pattern):
    """After fusion: act -> conv -> BN (or conv -> BN -> act with conv_bn_act_pattern)."""
    if not conv_bn_act_pattern:
        features = nn_layers.activation(features, act_type)
    if separable_conv:
        features = nn_layers.separable_conv2d(features, num_filters, 3,
                                              use_bias=not conv_bn_act_pattern, name='conv')
    else:
        features = nn_layers.conv2d(features, num_filters, 3,
                                    use_bias=not conv_bn_act_pattern, name='conv')
    return norm_fn(features, name='bn', act_type=act_type if conv_bn_act_pattern else None)


def build_bifpn_cell(features, sizes, nodes, num_filters, norm_fn, act_type, weight_method,
                     separable_conv=True, apply_bn=True, conv_after_downsample=False,
                     conv_bn_act_pattern=False):
    """One BiFPN cell. features: list of [B, h_l, w_l, C_l] for consecutive levels (min first);
    sizes: {level: (h, w)}; nodes: fpn_configs.bifpn_config(...).
    Returns the list of [B, h_l, w_l, num_filters] outputs, min level first."""
    min_level = min(sizes)
    feats = list(features)
    for index, node in enumerate(nodes):
        with tf1.variable_scope('fnode%d' % index):
            inputs = [resample_feature_map(
                feats[offset], '%d_%d_%d' % (position, offset, len(feats)), sizes[node.level],
                num_filters, norm_fn, apply_bn, conv_after_downsample)
                for position, offset in enumerate(node.inputs)]
            fused = fuse_features(inputs, weight_method)
            with tf1.variable_scope('op_after_combine%d' % len(feats)):
                fused = _combine_op(fused, num_filters, norm_fn, act_type, separable_conv,
                                    conv_bn_act_pattern)
        feats.append(fused)
    outputs = fpn_configs.output_node_ids(nodes, min_level, max(sizes))
    return [feats[outputs[level]] for level in sorted(sizes)]


def build_feature_network(backbone_features, sizes, num_filters, cell_repeats, norm_fn,
                          act_type, weight_method, separable_conv=True, apply_bn=True,
                          conv_after_downsample=False, conv_bn_act_pattern=False):
    """Extra levels + `cell_repeats` BiFPN cells.

    backbone_features: {1..5: [B, h, w, C]}; sizes: {level: (h, w)} for min..max level.
    Returns {level: [B, h, w, num_filters]} for min..max level.
    """
    levels = sorted(sizes)
    feats = []
    for level in levels:
        if level in backbone_features:
            feats.append(backbone_features[level])
        else:
            feats.append(resample_feature_map(
                feats[-1], 'p%d' % level, sizes[level], num_filters, norm_fn, apply_bn,
                conv_after_downsample))
        if tuple(feats[-1].shape[1:3]) != sizes[level]:
            raise ValueError('level %d feature map is %s, expected %s (H, W); levels must '
                             'halve exactly' % (level, feats[-1].shape[1:3], sizes[level]))
    nodes = fpn_configs.bifpn_config(levels[0], levels[-1])
    with tf1.variable_scope('fpn_cells'):
        for repeat in range(cell_repeats):
            with tf1.variable_scope('cell_%d' % repeat):
                feats = build_bifpn_cell(
                    feats, sizes, nodes, num_filters, norm_fn, act_type, weight_method,
                    separable_conv, apply_bn, conv_after_downsample, conv_bn_act_pattern)
    return dict(zip(levels, feats))


def _head_conv(features, filters, name, separable_conv, bias_initializer):
    if separable_conv:
        initializer = tf1.variance_scaling_initializer()
        return nn_layers.separable_conv2d(
            features, filters, 3, use_bias=True, depthwise_initializer=initializer,
            pointwise_initializer=initializer, bias_initializer=bias_initializer, name=name)
    return nn_layers.conv2d(
        features, filters, 3, use_bias=True, bias_initializer=bias_initializer,
        kernel_initializer=tf1.random_normal_initializer(stddev=0.01), name=name)


def head_net(features, level, prefix, outputs, num_filters, repeats, norm_fn, act_type,
             separable_conv, predict_bias_initializer, survival_prob=None, is_training=False):
    """Shared head tower for one level: `repeats` x (conv -> per-level BN -> act), then the
    prediction conv `<prefix>-predict`. [B, h, w, C] -> [B, h, w, outputs].

    With survival_prob (google/automl's hparam of that name), every conv after the first
    also gets a residual connection around it, its branch dropped per example in training
    (drop-connect keeping survival_prob), as automl's class_net / box_net."""
    for index in range(repeats):
        residual = features
        features = _head_conv(features, num_filters, '%s-%d' % (prefix, index), separable_conv,
                              tf1.zeros_initializer())
        features = norm_fn(features, name='%s-%d-bn-%d' % (prefix, index, level),
                           act_type=act_type)
        if index > 0 and survival_prob:
            features = nn_layers.drop_connect(features, is_training, survival_prob) + residual
    return _head_conv(features, outputs, '%s-predict' % prefix, separable_conv,
                      predict_bias_initializer)


def build_heads(feats, num_classes, num_anchors, num_filters, repeats, norm_fn, act_type,
                separable_conv=True, survival_prob=None, is_training=False):
    """Class and box heads, conv weights shared across levels (AUTO_REUSE), BN per level.

    feats: {level: [B, h, w, C]}. survival_prob: head_net's (None: no residuals).
    Returns ({level: [B, h, w, A * num_classes]}, {level: [B, h, w, A * 4]}) in the compute
    dtype.
    """
    head = functools.partial(head_net, num_filters=num_filters, repeats=repeats,
                             norm_fn=norm_fn, act_type=act_type, separable_conv=separable_conv,
                             survival_prob=survival_prob, is_training=is_training)
    class_outputs, box_outputs = {}, {}
    class_bias = nn_layers.prior_probability_bias(0.01)
    with tf1.variable_scope('class_net', reuse=tf1.AUTO_REUSE):
        for level, features in sorted(feats.items()):
            class_outputs[level] = head(features, level, 'class', num_classes * num_anchors,
                                        predict_bias_initializer=class_bias)
    with tf1.variable_scope('box_net', reuse=tf1.AUTO_REUSE):
        for level, features in sorted(feats.items()):
            box_outputs[level] = head(features, level, 'box', 4 * num_anchors,
                                      predict_bias_initializer=tf1.zeros_initializer())
    return class_outputs, box_outputs


def build_model(images, config, is_training, allreduce_mean_fn=None, compute_dtype='float32'):
    """Builds EfficientDet in the current graph.

    Args:
      images: float32 [B, H, W, 3], normalised; (H, W) = parse_image_size(config.image_size),
        static, multiples of 2**config.max_level.
      config: hparams_config.Config (validated here).
      is_training: Python bool: batch statistics + UPDATE_OPS + drop-connect when True.
        Drop-connect: the backbone's config.backbone_survival_prob (None: automl's per
        backbone, off for B0) and the heads' config.survival_prob (automl's meaning).
      allreduce_mean_fn: f(float32 tensor) -> its mean over workers; used for synchronous
        batch norm when config.sync_batch_norm is set (ignored otherwise, and local batch norm
        is used when it is None).
      compute_dtype: 'float32', 'bfloat16' (CPU/HPU) or 'float16' (GPU): a finalised run's
        settings.runtime.compute_dtype; variables stay float32 either way. config's
        mixed_precision key is not read here.
    Returns:
      (class_outputs, box_outputs): {level: float32 [B, H/2**l, W/2**l, A * num_classes]} and
      {level: float32 [B, H/2**l, W/2**l, A * 4]}, A = num_scales * len(aspect_ratios).
    """
    if not config.is_frozen:  # A frozen one was validated when it was finalised.
        hparams_config.validate(config)
    dtype = resolve_compute_dtype(compute_dtype)
    height, width = hparams_config.parse_image_size(config.image_size)
    _check_images(images, height, width, config.image_size)
    norm_fn = functools.partial(
        nn_layers.batch_norm, is_training=is_training, momentum=config.batch_norm_momentum,
        epsilon=config.batch_norm_epsilon,
        allreduce_mean_fn=allreduce_mean_fn if config.sync_batch_norm else None)
    getter = nn_layers.precision_custom_getter if dtype != tf.float32 else None
    backbone_survival_prob = config.backbone_survival_prob
    if backbone_survival_prob is None:
        backbone_survival_prob = efficientnet_builder.default_survival_prob(config.backbone_name)
    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=getter):
        backbone = efficientnet_builder.build_backbone(
            tf.cast(images, dtype), config.backbone_name, norm_fn, act_type=config.act_type,
            is_training=is_training, survival_prob=backbone_survival_prob)
        feats = build_feature_network(
            backbone, feature_sizes(height, width, config.min_level, config.max_level),
            config.fpn_num_filters, config.fpn_cell_repeats, norm_fn, config.act_type,
            config.fpn_weight_method, config.separable_conv, config.apply_bn_for_resampling,
            config.conv_after_downsample, config.conv_bn_act_pattern)
        class_outputs, box_outputs = build_heads(
            feats, config.num_classes, hparams_config.anchors_per_location(config),
            config.fpn_num_filters, config.box_class_repeats, norm_fn, config.act_type,
            config.separable_conv, config.survival_prob, is_training)
    return ({level: tf.cast(t, tf.float32) for level, t in class_outputs.items()},
            {level: tf.cast(t, tf.float32) for level, t in box_outputs.items()})
