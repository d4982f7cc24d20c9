"""EfficientDet network on tiny configs: shapes, sharing, batch norm, precision, errors."""
import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.ops import nn_layers

tf1 = tf.compat.v1

NUM_CLASSES = 2
ANCHORS = 9  # num_scales 3 x 3 aspect ratios.


def tiny_config(image_size=128, max_level=7, **overrides):
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override(dict(dict(num_classes=NUM_CLASSES, image_size=image_size, fpn_num_filters=16,
                              fpn_cell_repeats=1, box_class_repeats=1, max_level=max_level,
                              backbone_name='efficientnet-b0'), **overrides))
    return config


def _images(config, batch=2):
    height, width = hparams_config.parse_image_size(config.image_size)
    return tf1.placeholder(tf.float32, [batch, height, width, 3], name='images')


def _random_images(config, batch=2, seed=0):
    height, width = hparams_config.parse_image_size(config.image_size)
    return np.random.RandomState(seed).normal(size=[batch, height, width, 3]).astype(np.float32)


def _run(fetches, feed):
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        return sess.run(fetches, feed)


@pytest.mark.parametrize('image_size,max_level,height,width', [
    (128, 7, 128, 128), ('128x64', 5, 64, 128)])
def test_forward_output_shapes(image_size, max_level, height, width):
    config = tiny_config(image_size, max_level)
    with tf.Graph().as_default():
        images = _images(config)
        class_outputs, box_outputs = efficientdet_arch.build_model(images, config, False)
        values = _run((class_outputs, box_outputs), {images: _random_images(config)})
    assert sorted(values[0]) == sorted(values[1]) == list(range(3, max_level + 1))
    for level in range(3, max_level + 1):
        h, w = height // 2 ** level, width // 2 ** level
        assert values[0][level].shape == (2, h, w, ANCHORS * NUM_CLASSES)
        assert values[1][level].shape == (2, h, w, ANCHORS * 4)
        assert values[0][level].dtype == values[1][level].dtype == np.float32
        assert np.isfinite(values[0][level]).all() and np.isfinite(values[1][level]).all()


class BuiltModel:
    """One tiny inference graph (levels 3..6) shared by the naming and sharing tests."""

    def __init__(self):
        self.config = tiny_config(max_level=6)
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.images = _images(self.config)
            self.outputs = efficientdet_arch.build_model(self.images, self.config, False)
            self.variables = tf1.global_variables()
            self.trainable = tf1.trainable_variables()
            self.update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        self.names = {v.op.name for v in self.variables}

    def run(self, fetches):
        with self.graph.as_default():
            return _run(fetches, {self.images: _random_images(self.config)})


@pytest.fixture(scope='module')
def built():
    return BuiltModel()


def test_heads_share_convs_and_keep_batch_norm_per_level(built):
    names = built.names
    for net, prefix in (('class_net', 'class'), ('box_net', 'box')):
        convs = sorted(n for n in names if n.startswith('%s/%s-0/' % (net, prefix)))
        assert convs == ['%s/%s-0/%s' % (net, prefix, v)
                         for v in ('bias', 'depthwise_kernel', 'pointwise_kernel')]
        for level in (3, 4, 5, 6):
            assert '%s/%s-0-bn-%d/gamma' % (net, prefix, level) in names
        assert '%s/%s-predict/pointwise_kernel' % (net, prefix) in names
    predict = [v.op.name for v in built.trainable if 'class_net/class-predict/' in v.name]
    assert sorted(predict) == [
        'class_net/class-predict/bias', 'class_net/class-predict/depthwise_kernel',
        'class_net/class-predict/pointwise_kernel']


def test_backbone_and_fpn_scope_names(built):
    for name in ['efficientnet-b0/stem/conv2d/kernel', 'resample_p6/conv2d/kernel',
                 'resample_p6/bn/moving_mean',
                 # Levels 3..6 are node ids 0..3; fnode0 (P5') fuses P5 (id 2, 320 channels,
                 # projected by a 1x1 conv) with P6 (id 3) and is node id 4.
                 'fpn_cells/cell_0/fnode0/resample_0_2_4/conv2d/kernel',
                 'fpn_cells/cell_0/fnode0/WSM', 'fpn_cells/cell_0/fnode0/WSM_1',
                 'fpn_cells/cell_0/fnode0/op_after_combine4/conv/pointwise_kernel',
                 'fpn_cells/cell_0/fnode0/op_after_combine4/bn/gamma']:
        assert name in built.names
    assert not any(n.startswith('fpn_cells/cell_0/fnode0/resample_1_3_4/') for n in built.names)


def test_weight_decay_name_filter_catches_every_conv_weight(built):
    trainable = {v.op.name.split('/')[-1] for v in built.trainable}
    frozen = {v.op.name.split('/')[-1] for v in built.variables} - trainable
    assert {n for n in trainable if 'kernel' not in n and 'weights' not in n} == {
        'bias', 'gamma', 'beta', 'WSM', 'WSM_1', 'WSM_2'}
    assert frozen == {'moving_mean', 'moving_variance'}


def test_class_predict_bias_starts_at_prior_probability(built):
    bias = [v for v in built.variables if v.op.name == 'class_net/class-predict/bias'][0]
    value = built.run(bias)
    np.testing.assert_allclose(value, -np.log((1 - 0.01) / 0.01), rtol=1e-6)
    assert value.shape == (ANCHORS * NUM_CLASSES,)


def test_inference_mode_adds_no_update_ops(built):
    assert built.update_ops == []


def test_training_mode_adds_update_ops_that_move_statistics():
    config = tiny_config(max_level=5)
    with tf.Graph().as_default():
        images = _images(config)
        efficientdet_arch.build_model(images, config, True)
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        mean = [v for v in tf1.global_variables()
                if v.op.name == 'efficientnet-b0/stem/tpu_batch_normalization/moving_mean'][0]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(update_ops, {images: _random_images(config)})
            moved = sess.run(mean)
        num_bn = len([v for v in tf1.global_variables() if v.op.name.endswith('/gamma')])
    assert len(update_ops) == 2 * num_bn  # moving mean and variance of every batch norm
    assert np.abs(moved).max() > 0


def _build_twice(first, second, feed_config):
    """Builds two models sharing variables; returns both outputs evaluated on one batch."""
    with tf.Graph().as_default():
        images = _images(feed_config)
        outputs_a = first(images)
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            outputs_b = second(images)
        return _run((outputs_a, outputs_b), {images: _random_images(feed_config)})


def test_bfloat16_compute_gives_float32_outputs_close_to_float32():
    # Training mode, so batch norm keeps activations at unit scale and the outputs depend on
    # the whole network (in inference mode with fresh moving statistics the class outputs
    # are ~ the prior bias everywhere). bfloat16 keeps 8 mantissa bits, and 50+ layers with
    # small-sample batch statistics add noise, so "close" means strongly correlated.
    config = tiny_config(max_level=5)
    half = tiny_config(max_level=5, mixed_precision=True)
    values_32, values_16 = _build_twice(
        lambda x: efficientdet_arch.build_model(x, config, True),
        lambda x: efficientdet_arch.build_model(x, half, True, compute_dtype='bfloat16'),
        config)
    for level in (3, 4, 5):
        for full, low in ((values_32[0][level], values_16[0][level]),
                          (values_32[1][level], values_16[1][level])):
            assert low.dtype == np.float32 and np.isfinite(low).all()
            assert np.corrcoef(full.ravel(), low.ravel())[0, 1] > 0.9
            assert np.std(full - low) < 0.5 * np.std(full)


def test_sync_batch_norm_with_identity_allreduce_matches_local():
    calls = []

    def identity_mean(tensor):
        calls.append(tensor)
        return tensor

    local = tiny_config(max_level=5)
    synced = tiny_config(max_level=5, sync_batch_norm=True)
    values_local, values_sync = _build_twice(
        lambda x: efficientdet_arch.build_model(x, local, True),
        lambda x: efficientdet_arch.build_model(x, synced, True, allreduce_mean_fn=identity_mean),
        local)
    assert calls and all(t.dtype == tf.float32 for t in calls)
    for level in (3, 4, 5):
        for outputs_sync, outputs_local in zip(values_sync, values_local):
            np.testing.assert_allclose(outputs_sync[level], outputs_local[level],
                                       rtol=1e-4, atol=1e-4)


def test_batch_norm_sync_path_equals_fused_path_on_one_layer():
    values = np.random.RandomState(1).normal(2.0, 3.0, size=[4, 5, 6, 7]).astype(np.float32)
    with tf.Graph().as_default():
        inputs = tf.constant(values)
        fused = nn_layers.batch_norm(inputs, True, name='bn')
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            synced = nn_layers.batch_norm(inputs, True, name='bn', allreduce_mean_fn=tf.identity)
        fused, synced = _run((fused, synced), {})
    expected = (values - values.mean((0, 1, 2))) / np.sqrt(values.var((0, 1, 2)) + 1e-3)
    np.testing.assert_allclose(fused, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(synced, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype,tolerance', [(tf.float32, 1e-5), (tf.bfloat16, 3e-2)])
def test_inference_batch_norm_uses_the_moving_statistics(dtype, tolerance):
    rng = np.random.RandomState(2)
    values = rng.normal(2.0, 3.0, size=[2, 3, 4, 5]).astype(np.float32)
    stats = {name: rng.uniform(0.5, 2.0, size=[5]).astype(np.float32)
             for name in ('gamma', 'beta', 'moving_mean', 'moving_variance')}
    with tf.Graph().as_default():
        outputs = nn_layers.batch_norm(tf.cast(tf.constant(values), dtype), False, name='bn')
        assert outputs.dtype == dtype
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for name, value in stats.items():
                variable = [v for v in tf1.global_variables() if v.op.name == 'bn/' + name][0]
                variable.load(value, session)
            got = session.run(tf.cast(outputs, tf.float32))
    expected = (stats['gamma'] * (values - stats['moving_mean'])
                / np.sqrt(stats['moving_variance'] + 1e-3) + stats['beta'])
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize('overrides,present,absent', [
    (dict(fpn_weight_method='attn', separable_conv=False),
     ['fpn_cells/cell_0/fnode0/WSM_1', 'fpn_cells/cell_0/fnode0/op_after_combine4/conv/kernel',
      'class_net/class-0/kernel'],
     ['fpn_cells/cell_0/fnode0/op_after_combine4/conv/pointwise_kernel']),
    (dict(fpn_weight_method='sum', conv_bn_act_pattern=True, act_type='relu'),
     ['fpn_cells/cell_0/fnode0/op_after_combine4/conv/pointwise_kernel'],
     ['fpn_cells/cell_0/fnode0/WSM', 'fpn_cells/cell_0/fnode0/op_after_combine4/conv/bias']),
    (dict(conv_after_downsample=True, apply_bn_for_resampling=False),
     ['resample_p6/conv2d/kernel', 'fpn_cells/cell_0/fnode0/resample_0_2_4/conv2d/kernel'],
     ['resample_p6/bn/gamma', 'fpn_cells/cell_0/fnode0/resample_0_2_4/bn/gamma'])])
def test_fpn_options_build_with_exact_shapes(overrides, present, absent):
    config = tiny_config(max_level=6, **overrides)
    with tf.Graph().as_default():
        class_outputs, box_outputs = efficientdet_arch.build_model(_images(config), config, True)
        names = {v.op.name for v in tf1.global_variables()}
    assert class_outputs[6].shape.as_list() == [2, 2, 2, ANCHORS * NUM_CLASSES]
    assert box_outputs[3].shape.as_list() == [2, 16, 16, ANCHORS * 4]
    assert set(present) <= names
    assert not set(absent) & names


def test_levels_above_5_round_up_and_upsample_nearest_as_automl():
    # 160 px, levels 3-7: 20, 10, 5, then ceil: 3, 2. The BiFPN upsamples 2 -> 3 and 3 -> 5
    # by nearest resizing (source index floor(i * 3 / 5): 0, 0, 1, 1, 2).
    config = tiny_config(image_size=160, max_level=7)
    with tf.Graph().as_default():
        class_outputs, _ = efficientdet_arch.build_model(_images(config, batch=1), config, False)
        assert {l: t.shape.as_list()[1:3] for l, t in class_outputs.items()} == {
            3: [20, 20], 4: [10, 10], 5: [5, 5], 6: [3, 3], 7: [2, 2]}
        small = tf.reshape(tf.range(3.0), [1, 3, 1, 1])
        with tf1.Session() as session:
            upsampled = session.run(efficientdet_arch.resample_feature_map(
                small, 'test', (5, 1), 1, norm_fn=None, apply_bn=False))
    assert upsampled.reshape(-1).tolist() == [0.0, 0.0, 1.0, 1.0, 2.0]


def test_image_size_not_divisible_is_a_config_error():
    config = tiny_config(image_size=80, max_level=7)
    with tf.Graph().as_default():
        with pytest.raises(hparams_config.ConfigError,
                           match='divisible by 2\\^min\\(max_level, 5\\) = 32'):
            efficientdet_arch.build_model(_images(config), config, False)


def test_images_must_match_config_image_size():
    config = tiny_config(max_level=5)
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [1, 64, 128, 3])
        with pytest.raises(ValueError, match='image_size=128'):
            efficientdet_arch.build_model(images, config, False)


def test_compute_dtype_is_the_one_precision_field_the_network_reads():
    """settings.finalize turns mixed_precision into compute_dtype; the network reads only
    compute_dtype (evaluation builds a mixed-precision run's config in float32 as it is)."""
    config = tiny_config(max_level=5, mixed_precision=True)
    with tf.Graph().as_default() as graph:
        efficientdet_arch.build_model(_images(config), config, False, compute_dtype='float32')
        assert not [op for op in graph.get_operations()
                    if any(t.dtype == tf.bfloat16 for t in op.outputs)]
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match='compute_dtype'):
            efficientdet_arch.build_model(_images(config), config, False,
                                          compute_dtype='float64')


def test_upsample_nearest_repeats_pixels_exactly():
    values = np.arange(6, dtype=np.float32).reshape([1, 2, 3, 1])
    with tf.Graph().as_default():
        up = nn_layers.upsample_nearest(tf.constant(values), 2, 2)
        assert up.shape.as_list() == [1, 4, 6, 1]
        result = _run(up, {})
    np.testing.assert_array_equal(result[0, :, :, 0], np.repeat(np.repeat(values[0, :, :, 0],
                                                                          2, 0), 2, 1))


def _random_ops_by_scope(config):
    """Scopes ('efficientnet-b0', 'class_net', ...) holding drop-connect's random draws in a
    training graph."""
    with tf.Graph().as_default() as graph:
        efficientdet_arch.build_model(_images(config), config, True)
    return {op.name.split('/')[0] for op in graph.get_operations()
            if op.type == 'RandomUniform' and '/Initializer/' not in op.name}


def test_drop_connect_is_automls_in_backbone_and_heads():
    # B0 inside D0 has none (automl turns it off); backbone_survival_prob sets it; automl's
    # survival_prob is the heads'.
    assert _random_ops_by_scope(tiny_config(max_level=5)) == set()
    assert _random_ops_by_scope(tiny_config(max_level=5, backbone_survival_prob=0.8)) == {
        'efficientnet-b0'}
    assert _random_ops_by_scope(tiny_config(max_level=5, survival_prob=0.8,
                                            box_class_repeats=2)) == {'class_net', 'box_net'}


@pytest.mark.parametrize('repeats, same', [(1, True), (2, False)])
def test_head_survival_prob_adds_residuals_after_the_first_conv(repeats, same):
    # automl's class_net / box_net: `if i > 0 and survival_prob: x = drop_connect(x) + input`,
    # so with one conv per head nothing changes, with two the second gets a residual (also
    # at inference, where drop-connect itself is the identity).
    plain = tiny_config(max_level=5, box_class_repeats=repeats)
    residual = tiny_config(max_level=5, box_class_repeats=repeats, survival_prob=0.8)
    values_plain, values_residual = _build_twice(
        lambda x: efficientdet_arch.build_model(x, plain, False),
        lambda x: efficientdet_arch.build_model(x, residual, False), plain)
    for outputs_plain, outputs_residual in zip(values_plain, values_residual):
        equal = all(np.array_equal(outputs_plain[level], outputs_residual[level])
                    for level in (3, 4, 5))
        assert equal == same
