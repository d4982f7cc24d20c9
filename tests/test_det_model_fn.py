"""model_fn pieces in-process: the learning-rate schedule by hand, and real training steps on a
fixed batch driving the loss down."""
import math

import numpy as np
import tensorflow as tf

import dataloader
import det_model_fn
import hparams_config
from conftest import TINY_HPARAMS

tf1 = tf.compat.v1


def _schedule_values(steps, **kwargs):
    with tf.Graph().as_default():
        step = tf1.placeholder(tf.int64, [])
        rate = det_model_fn.learning_rate_schedule(step, **kwargs)
        with tf1.Session() as session:
            return [session.run(rate, {step: s}) for s in steps]


def test_warmup_then_cosine_by_hand():
    values = _schedule_values([0, 5, 10, 55, 100], base_rate=0.1, warmup_init=0.01,
                              warmup_steps=10, total_steps=100)
    # Warm-up: 0.01 + (0.1 - 0.01) * s / 10.  Cosine: 0.05 * (1 + cos(pi * (s - 10) / 90)).
    expected = [0.01, 0.055, 0.1, 0.05 * (1 + math.cos(math.pi * 0.5)), 0.0]
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-7)


def test_stepwise_schedule_by_hand():
    values = _schedule_values([3, 20, 60, 90], base_rate=0.1, warmup_init=0.1, warmup_steps=1,
                              total_steps=100, decay_method='stepwise', first_drop_step=50,
                              second_drop_step=80)
    np.testing.assert_allclose(values, [0.1, 0.1, 0.01, 0.001], rtol=1e-5)


def test_learning_rate_scales_with_the_global_batch():
    params = {'learning_rate': 0.08, 'lr_warmup_init': 0.008, 'lr_base_batch_size': 64,
              'global_batch_size': 16}
    np.testing.assert_allclose(det_model_fn._scaled_learning_rates(params), (0.02, 0.002))


def _tiny_params():
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override(TINY_HPARAMS + ',num_classes=3,input_rand_hflip=false,jitter_min=1.0,'
                    'jitter_max=1.0,learning_rate=0.08,lr_warmup_init=0.08,moving_average_decay=0.9')
    return dict(config.as_dict(), batch_size=2, global_batch_size=64, steps_per_epoch=100,
                total_steps=1000, compute_dtype='float32', seed=1)


def test_real_steps_on_a_fixed_batch_drive_the_loss_down(tiny_dataset):
    params = _tiny_params()
    with tf.Graph().as_default():
        tf1.set_random_seed(1)
        reader = dataloader.InputReader(tiny_dataset['train_pattern'], is_training=True,
                                        deterministic=True, seed=3)
        features, labels = tf1.data.make_one_shot_iterator(reader(params)).get_next()
        with tf1.Session() as session:
            batch = session.run((features, labels))
        images = tf.constant(batch[0])
        label_tensors = {k: tf.constant(v) for k, v in batch[1].items()}
        spec = det_model_fn.model_fn(images, label_tensors, tf1.estimator.ModeKeys.TRAIN, params)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            losses = [session.run([spec.train_op, spec.loss])[1] for _ in range(12)]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
