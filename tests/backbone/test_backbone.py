"""EfficientNet backbone: scaling rules, feature-map strides/channels, parameter counts."""
import functools

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.backbone import efficientnet_builder as builder
from efficientdet_hpu.backbone import efficientnet_model
from efficientdet_hpu.ops import nn_layers

tf1 = tf.compat.v1

# Published trainable parameter counts of the full ImageNet classifiers (EfficientNet paper
# Table 2: B0 5.3M ... B7 66M; exact values as reported by torchvision / timm / Keras, whose
# layers are the same as the TF reference: BN gamma/beta counted, moving statistics not).
PUBLISHED_CLASSIFIER_PARAMS = {
    'efficientnet-b0': 5288548, 'efficientnet-b1': 7794184, 'efficientnet-b2': 9109994,
    'efficientnet-b3': 12233232, 'efficientnet-b4': 19341616, 'efficientnet-b5': 30389784,
    'efficientnet-b6': 43040704, 'efficientnet-b7': 66347960,
}


# EfficientNet's classifier head width (B0), which EfficientDet does not build.
CLASSIFIER_HEAD_FILTERS = 1280


def classifier_head_params(model_name):
    """Parameters of what EfficientDet does not build, on top of the last block:
    1x1 conv last_channels -> round_filters(1280) (no bias) + its BN (gamma, beta)
    + the 1000-way dense layer (weights + bias). For B0: 320*1280 + 2*1280 + 1280*1000 + 1000
    = 409,600 + 2,560 + 1,281,000 = 1,693,160, leaving 5,288,548 - 1,693,160 = 3,595,388
    (~3.6M) for the stem and the 16 MBConv blocks."""
    head = builder.head_filters(model_name)
    last = builder.scaled_blocks(model_name)[-1].output_filters
    return last * head + 2 * head + head * 1000 + 1000


def _build(model_name, height, width, is_training=False):
    images = tf1.placeholder(tf.float32, [1, height, width, 3])
    norm_fn = functools.partial(nn_layers.batch_norm, is_training=is_training)
    return builder.build_backbone(images, model_name, norm_fn, is_training=is_training)


def _trainable_count():
    return int(sum(np.prod(v.shape.as_list()) for v in tf1.trainable_variables()))


def test_round_filters_and_repeats_by_hand():
    assert builder.round_filters(32, 1.0) == 32
    assert builder.round_filters(32, 1.1) == 32    # 35.2 -> int(39.2)//8*8 = 32 (>= 90%)
    assert builder.round_filters(16, 1.1) == 16    # 17.6 -> 16 (16 >= 15.84)
    assert builder.round_filters(40, 1.2) == 48    # 48.0 -> int(52)//8*8 = 48
    assert builder.round_filters(32, 1.8) == 56    # 57.6 -> int(61.6)//8*8 = 56
    assert builder.round_filters(1280, 1.8) == 2304
    assert builder.round_filters(320, 2.0) == 640
    assert builder.round_repeats(1, 1.1) == 2      # ceil(1.1)
    assert builder.round_repeats(4, 3.1) == 13     # ceil(12.4)


def test_block_counts():
    counts = {name: len(builder.scaled_blocks(name)) for name in builder.SCALING}
    # B0: 1+2+2+3+3+4+1; B7 (depth 3.1): 4+7+7+10+10+13+4.
    assert counts['efficientnet-b0'] == 16
    assert counts['efficientnet-b7'] == 55


# EfficientNet-Lite classifiers as published with TF EfficientNet's lite/ README (millions).
PUBLISHED_LITE_CLASSIFIER_MILLIONS = {
    'efficientnet-lite0': 4.7, 'efficientnet-lite1': 5.4, 'efficientnet-lite2': 6.1,
    'efficientnet-lite3': 8.2, 'efficientnet-lite4': 13.0}


def test_lite_stages_fix_stem_first_and_last_stage_and_drop_se():
    # Lite4 (width 1.4, depth 1.8): stages 1 and 7 keep 1 block; 2*1.8 -> 4, 3*1.8 -> 6,
    # 4*1.8 -> 8. The stem stays 32 filters, so block 0 takes 32 (B4's would be 48).
    blocks = builder.scaled_blocks('efficientnet-lite4')
    assert len(blocks) == 1 + 4 + 4 + 6 + 6 + 8 + 1
    assert [b.input_filters for b in blocks[:2]] == [32, 24]
    assert {b.se_ratio for b in blocks} == {0.0}
    assert (builder.stem_filters('efficientnet-lite4'), builder.head_filters('efficientnet-lite4'),
            builder.head_filters('efficientnet-b4')) == (32, 1280, 1792)
    assert len(builder.scaled_blocks('efficientnet-b4')) == 2 + 4 + 4 + 6 + 6 + 8 + 2


@pytest.mark.parametrize('model_name', [
    pytest.param(name, marks=() if name == 'efficientnet-lite0' else pytest.mark.slow)
    for name in sorted(PUBLISHED_LITE_CLASSIFIER_MILLIONS)])
def test_lite_backbone_plus_head_matches_published_classifier(model_name):
    with tf.Graph().as_default():
        _build(model_name, 32, 32)
        count = _trainable_count() + classifier_head_params(model_name)
    assert round(count / 1e6, 1) == PUBLISHED_LITE_CLASSIFIER_MILLIONS[model_name]


def test_decode_block_rejects_bad_string():
    with pytest.raises(ValueError, match='r2_k3_s2_e6_i16_o24_se0.25'):
        builder.decode_block('r2_k3_e6')


@pytest.mark.parametrize('height,width', [(64, 64), (64, 96)])
def test_b0_feature_strides_and_channels(height, width):
    with tf.Graph().as_default():
        endpoints = _build('efficientnet-b0', height, width)
    channels = {1: 16, 2: 24, 3: 40, 4: 112, 5: 320}
    assert sorted(endpoints) == [1, 2, 3, 4, 5]
    for level, tensor in endpoints.items():
        stride = 2 ** level
        assert tensor.shape.as_list() == [1, height // stride, width // stride, channels[level]]


def test_variable_names_follow_the_reference_checkpoints():
    with tf.Graph().as_default():
        _build('efficientnet-b0', 32, 32)
        names = {v.op.name for v in tf1.global_variables()}
    for name in ['efficientnet-b0/stem/conv2d/kernel',
                 'efficientnet-b0/stem/tpu_batch_normalization/moving_variance',
                 'efficientnet-b0/blocks_0/depthwise_conv2d/depthwise_kernel',
                 'efficientnet-b0/blocks_0/tpu_batch_normalization/gamma',
                 'efficientnet-b0/blocks_0/se/conv2d/bias',
                 'efficientnet-b0/blocks_0/conv2d/kernel',
                 'efficientnet-b0/blocks_0/tpu_batch_normalization_1/beta',
                 'efficientnet-b0/blocks_15/conv2d_1/kernel',
                 'efficientnet-b0/blocks_15/se/conv2d_1/kernel',
                 'efficientnet-b0/blocks_15/tpu_batch_normalization_2/moving_mean']:
        assert name in names
    assert 'efficientnet-b0/blocks_16/conv2d/kernel' not in names


@pytest.mark.parametrize('model_name', [  # B1-B7 are full-size graphs of seconds each: slow.
    pytest.param(name, marks=() if name == 'efficientnet-b0' else pytest.mark.slow)
    for name in sorted(PUBLISHED_CLASSIFIER_PARAMS)])
def test_backbone_params_match_published_classifier_without_head(model_name):
    with tf.Graph().as_default():
        _build(model_name, 32, 32)
        count = _trainable_count()
    expected = PUBLISHED_CLASSIFIER_PARAMS[model_name] - classifier_head_params(model_name)
    assert count == expected


def test_b0_backbone_param_count_by_hand():
    assert (PUBLISHED_CLASSIFIER_PARAMS['efficientnet-b0']
            - classifier_head_params('efficientnet-b0')) == 3595388


def _random_ops():
    return [op for op in tf1.get_default_graph().get_operations() if op.type == 'RandomUniform']


@pytest.mark.parametrize('is_training,expected', [(True, 9), (False, 0)])
def test_drop_connect_only_in_training_on_residual_blocks(is_training, expected):
    # B0 residual blocks (stride 1, filters in == out): stages 2..6 minus their first block
    # = 1 + 1 + 2 + 2 + 3 = 9.
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [2, 32, 32, 3])
        norm_fn = functools.partial(nn_layers.batch_norm, is_training=is_training)
        builder.build_backbone(images, 'efficientnet-b0', norm_fn, is_training=is_training,
                               survival_prob=0.8)
        assert len(_random_ops()) == expected


def test_survival_prob_decays_linearly_over_blocks():
    assert efficientnet_model.block_survival_prob(0.8, 0, 16) == 1.0
    assert efficientnet_model.block_survival_prob(0.8, 8, 16) == pytest.approx(0.9)
    assert efficientnet_model.block_survival_prob(None, 8, 16) is None


def test_training_adds_a_moving_average_update_per_batch_norm():
    with tf.Graph().as_default():
        _build('efficientnet-b0', 32, 32, is_training=True)
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        num_bn = len([v for v in tf1.global_variables() if v.op.name.endswith('/gamma')])
    # stem + block 0 (2 BN) + 15 blocks with expansion (3 BN each); mean and variance each.
    assert num_bn == 1 + 2 + 3 * 15
    assert len(update_ops) == 2 * num_bn


def test_drop_connect_defaults_are_automls_inside_efficientdet():
    # automl's efficientdet_arch.build_backbone turns B0's drop-connect off; the others keep
    # EfficientNet's 0.8.
    assert builder.default_survival_prob('efficientnet-b0') is None
    assert {builder.default_survival_prob('efficientnet-b%d' % i) for i in range(1, 8)} == {0.8}
    with pytest.raises(ValueError, match='efficientnet-b9'):
        builder.default_survival_prob('efficientnet-b9')
