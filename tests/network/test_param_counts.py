"""Trainable parameter counts of D0..D7x (COCO, 90 classes) against the published ones.

Published (paper Table 2 and the google/automl README, in millions): counted over the
trainable variables, i.e. conv kernels and biases, BN gamma/beta and fusion weights; BN moving
statistics are not parameters. Parameters do not depend on the image size, so each variant
is built (never run) at its smallest legal size, 2**max_level, with batch 1.

EfficientDet-Lite0..Lite4: published in the google/automl README (3.2M ... 15.1M) and counted
exactly with automl's own code: a scratch step outside this repository ran automl's TF1
`efficientdet_arch.efficientdet` (google/automl at 6a54c87, `efficientdet/`, on PYTHONPATH,
is_training_bn=False, 90 classes, a [1, 128, 128, 3] placeholder) and summed its trainable
variables; the totals and the `efficientnet-liteN/` share are AUTOML_LITE_COUNTS. The same step
found automl's global variable names and shapes equal to ours (1,068 of them for Lite4).
"""
import functools

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.cli import model_inspect
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.network import efficientdet_arch

tf1 = tf.compat.v1

PUBLISHED_MILLIONS = {
    'efficientdet-d0': 3.9, 'efficientdet-d1': 6.6, 'efficientdet-d2': 8.1,
    'efficientdet-d3': 12.0, 'efficientdet-d4': 20.7, 'efficientdet-d5': 33.7,
    'efficientdet-d6': 51.9, 'efficientdet-d7': 51.9, 'efficientdet-d7x': 77.0,
    'efficientdet-lite0': 3.2, 'efficientdet-lite1': 4.2, 'efficientdet-lite2': 5.3,
    'efficientdet-lite3': 8.4, 'efficientdet-lite3x': 9.3, 'efficientdet-lite4': 15.1,
}

# (all trainable, the efficientnet-liteN/ backbone's share), counted by automl's code.
AUTOML_LITE_COUNTS = {
    'efficientdet-lite0': (3243470, 2958848), 'efficientdet-lite1': (4248318, 3723520),
    'efficientdet-lite2': (5252334, 4357952), 'efficientdet-lite3': (8350862, 6422016),
    'efficientdet-lite3x': (9280862, 6422016), 'efficientdet-lite4': (15130894, 11149568),
}
FAST = ('efficientdet-d0', 'efficientdet-lite0')  # The rest are 5-15 s graphs each: slow.


@functools.lru_cache(maxsize=None)
def trainable_shapes(model_name):
    """{variable name: shape} of the trainable variables of one variant (built once)."""
    config = hparams_config.get_efficientdet_config(model_name)
    side = 2 ** config.max_level
    config.image_size = side
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [1, side, side, 3])
        efficientdet_arch.build_model(images, config, is_training=False)
        return {v.op.name: tuple(v.shape.as_list()) for v in tf1.trainable_variables()}


def _count(shapes):
    return int(sum(np.prod(shape) for shape in shapes))


def _variants(names):
    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow)
            for name in sorted(names)]


@pytest.mark.parametrize('model_name', _variants(PUBLISHED_MILLIONS))
def test_params_match_published(model_name):
    count = _count(trainable_shapes(model_name).values())
    published = PUBLISHED_MILLIONS[model_name] * 1e6
    assert abs(count - published) / published < 0.015, (model_name, count)


@pytest.mark.parametrize('model_name', _variants(AUTOML_LITE_COUNTS))
def test_lite_params_equal_automls_own_count(model_name):
    shapes = trainable_shapes(model_name)
    backbone_name = hparams_config.get_efficientdet_config(model_name).backbone_name
    backbone = [s for n, s in shapes.items() if n.startswith(backbone_name + '/')]
    assert (_count(shapes.values()), _count(backbone)) == AUTOML_LITE_COUNTS[model_name]


def test_lite0_backbone_has_no_squeeze_excite_and_a_fixed_stem():
    # EfficientNet-Lite0: stem 3x3x3x32 unscaled, 16 blocks (1+2+2+3+3+4+1), no se/ scopes.
    shapes = trainable_shapes('efficientdet-lite0')
    backbone = {n: s for n, s in shapes.items() if n.startswith('efficientnet-lite0/')}
    assert backbone['efficientnet-lite0/stem/conv2d/kernel'] == (3, 3, 3, 32)
    assert not [n for n in backbone if '/se/' in n]
    blocks = {n.split('/')[1] for n in backbone if '/blocks_' in n}
    assert blocks == {'blocks_%d' % i for i in range(16)}


def test_only_class_predict_depends_on_the_class_count():
    # D0: C = 64 filters, A = 9 anchors, K = 90 classes. class-predict is a separable conv:
    # depthwise 3*3*C + pointwise C*A*K + bias A*K = 576 + 51,840 + 810.
    shapes = trainable_shapes('efficientdet-d0')
    predict = {n: s for n, s in shapes.items() if n.startswith('class_net/class-predict/')}
    assert predict == {'class_net/class-predict/depthwise_kernel': (3, 3, 64, 1),
                       'class_net/class-predict/pointwise_kernel': (1, 1, 64, 810),
                       'class_net/class-predict/bias': (810,)}
    assert _count(predict.values()) == 576 + 51840 + 810
    box_predict = [s for n, s in shapes.items() if n.startswith('box_net/box-predict/')]
    assert sorted(box_predict) == [(1, 1, 64, 36), (3, 3, 64, 1), (36,)]


def test_backbone_share_of_d0_is_efficientnet_b0_without_head():
    # 3,595,388 = EfficientNet-B0's 5,288,548 minus its head (see tests/backbone/test_backbone.py).
    shapes = trainable_shapes('efficientdet-d0')
    backbone = [s for n, s in shapes.items() if n.startswith('efficientnet-b0/')]
    assert _count(backbone) == 3595388


def test_model_inspect_counts_match_the_profiler_on_a_tiny_config():
    config = model_inspect.resolve_config(
        'efficientdet-d0', image_size='128x64', num_classes=2,
        hparams='fpn_num_filters=16,fpn_cell_repeats=1,box_class_repeats=1,max_level=6')
    built = model_inspect.build_inspection_graph(config)
    result = model_inspect.inspect_model(config, built)
    assert result['image_size'] == [64, 128]
    assert sorted(result['levels']) == ['3', '4', '5', '6']
    assert result['levels']['6'] == {'class': [1, 1, 2, 18], 'box': [1, 1, 2, 36]}
    options = tf1.profiler.ProfileOptionBuilder.float_operation()
    options['output'] = 'none'
    profiled = tf1.profiler.profile(built[0], options=options).total_float_ops
    assert result['flops'] == profiled // 2
    with built[0].as_default():
        assert result['params'] == _count(v.shape.as_list() for v in tf1.trainable_variables())
