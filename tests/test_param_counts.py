"""Trainable parameter counts of D0..D7x (COCO, 90 classes) against the published ones.

Published (paper Table 2 and the google/automl README, in millions): counted over the
trainable variables, i.e. conv kernels and biases, BN gamma/beta and fusion weights; BN moving
statistics are not parameters. Parameters do not depend on the image size, so each variant
is built (never run) at its smallest legal size, 2**max_level, with batch 1.
"""
import numpy as np
import pytest
import tensorflow as tf

import efficientdet_arch
import hparams_config

tf1 = tf.compat.v1

PUBLISHED_MILLIONS = {
    'efficientdet-d0': 3.9, 'efficientdet-d1': 6.6, 'efficientdet-d2': 8.1,
    'efficientdet-d3': 12.0, 'efficientdet-d4': 20.7, 'efficientdet-d5': 33.7,
    'efficientdet-d6': 51.9, 'efficientdet-d7': 51.9, 'efficientdet-d7x': 77.0,
}


def trainable_params(model_name):
    config = hparams_config.get_efficientdet_config(model_name)
    side = 2 ** config.max_level
    config.image_size = side
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [1, side, side, 3])
        efficientdet_arch.build_model(images, config, is_training=False)
        return int(sum(np.prod(v.shape.as_list()) for v in tf1.trainable_variables()))


@pytest.mark.parametrize('model_name', sorted(PUBLISHED_MILLIONS))
def test_params_match_published(model_name):
    count = trainable_params(model_name)
    published = PUBLISHED_MILLIONS[model_name] * 1e6
    assert abs(count - published) / published < 0.015, (model_name, count)


def test_params_grow_with_class_count_only_in_class_predict():
    # class-predict is a separable conv: depthwise 3x3xC + pointwise C x (A*K) + bias A*K,
    # with C = 64 and A = 9 for D0, so each extra class adds 9 * (64 + 1) = 585 parameters.
    base = trainable_params('efficientdet-d0')
    config_classes = hparams_config.get_efficientdet_config('efficientdet-d0')
    config_classes.num_classes = 91
    config_classes.image_size = 128
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [1, 128, 128, 3])
        efficientdet_arch.build_model(images, config_classes, is_training=False)
        more = int(sum(np.prod(v.shape.as_list()) for v in tf1.trainable_variables()))
    assert more - base == 9 * (64 + 1)
