"""model_fn pieces in-process: the learning-rate schedule by hand, and real training steps on a
fixed batch driving the loss down."""
import math

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.training import det_model_fn
from cli_runs import TINY_HPARAMS

tf1 = tf.compat.v1


def _schedule_values(steps, **kwargs):
    with tf.Graph().as_default():
        step = tf1.placeholder(tf.int64, [])
        rate = det_model_fn.learning_rate_schedule(step, **kwargs)
        with tf1.Session() as session:
            return [session.run(rate, {step: s}) for s in steps]


def test_warmup_then_cosine_by_hand():
    values = _schedule_values([0, 5, 10, 55, 100, 110], base_rate=0.1, warmup_init=0.01,
                              warmup_steps=10, total_steps=100)
    # Warm-up: 0.01 + (0.1 - 0.01) * s / 10.  Cosine, automl's: 0.05 * (1 + cos(pi * s / 90)),
    # counted from step 0 and not held at the end.
    cosine = [0.05 * (1 + math.cos(math.pi * s / 90.0)) for s in (10, 55, 100, 110)]
    np.testing.assert_allclose(values, [0.01, 0.055] + cosine, rtol=1e-5, atol=1e-7)


def test_cosine_from_warmup_end_by_hand():
    values = _schedule_values([10, 55, 100, 110], base_rate=0.1, warmup_init=0.01,
                              warmup_steps=10, total_steps=100, cosine_from_warmup_end=True)
    # 0.05 * (1 + cos(pi * (s - 10) / 90)), held at 0 after step 100.
    np.testing.assert_allclose(values, [0.1, 0.05, 0.0, 0.0], rtol=1e-5, atol=1e-7)


def _warning(examples, epochs, **hparams):
    """cosine_rise_warning of a run of batch 64 over `examples` images per epoch."""
    config = hparams_config.get_efficientdet_config().override(hparams)
    return det_model_fn.cosine_rise_warning(settings.finalize(config, settings.RunFacts(
        per_rank_batch=64, examples_per_epoch=examples, num_epochs=epochs)))


def test_automl_cosine_that_rises_again_is_said_in_one_line():
    # The demo's shape: 400 warm-up steps of 1600; automl's COCO: 1 epoch of 300.
    line = _warning(800 * 64, 2, lr_warmup_epoch=0.5)
    assert line.startswith("learning rate: automl's cosine (counted from step 0) reaches 0 at "
                           'step 1200 and rises back to 25% of its peak by step 1600')
    assert 'cosine_from_warmup_end=true' in line
    assert _warning(118287, 300, lr_warmup_epoch=1.0) is None
    assert _warning(800 * 64, 2, lr_warmup_epoch=0.5, cosine_from_warmup_end=True) is None


def test_stepwise_schedule_by_hand():
    # automl drops at the first and second drop step themselves (step >= drop).
    values = _schedule_values([0, 3, 49, 50, 79, 80, 90], base_rate=0.1, warmup_init=0.01,
                              warmup_steps=10, total_steps=100, decay_method='stepwise',
                              first_drop_step=50, second_drop_step=80)
    np.testing.assert_allclose(values, [0.01, 0.037, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-5)


def test_constant_schedule_has_no_warmup_as_in_automl():
    values = _schedule_values([0, 5, 50], base_rate=0.1, warmup_init=0.01, warmup_steps=10,
                              total_steps=100, decay_method='constant')
    np.testing.assert_allclose(values, [0.1, 0.1, 0.1], rtol=1e-6)


def test_positives_momentum_is_automls_moving_normaliser_by_hand():
    with tf.Graph().as_default():
        positives = tf1.placeholder(tf.float32, [2])
        normalizer = det_model_fn.positives_normalizer(positives, 0.9)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            values = [session.run(normalizer, {positives: p}) for p in ([3, 6], [1, 0])]
    # From 0, no bias correction (automl's keras moving_average_update): 0.1 * 10, then
    # 0.9 * 1 + 0.1 * 2.
    np.testing.assert_allclose(values, [1.0, 1.1], rtol=1e-6)


def test_learning_rate_scales_with_the_global_batch():
    config = hparams_config.get_efficientdet_config()
    config.override(dict(learning_rate=0.08, lr_warmup_init=0.008, lr_base_batch_size=64))
    params = settings.finalize(config, settings.RunFacts(ranks=4, per_rank_batch=4))
    assert params.batch.global_size == 16
    np.testing.assert_allclose((params.schedule.learning_rate, params.schedule.warmup_init),
                               (0.02, 0.002))


def _tiny_params(**overrides):
    """Batch 2, learning rate 0.08 (lr_base_batch_size 2), 100 steps per epoch, 1000 steps."""
    # Global-norm clipping only (the non-automl choice, tested here; automl's per-variable
    # clipping is tested against automl in test_automl_training.py): on this tiny batch the
    # per-variable cut to 10 slows the first 12 steps (the loss fell 19%, not the 20% below).
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override(TINY_HPARAMS + ',num_classes=3,input_rand_hflip=false,jitter_min=1.0,'
                    'jitter_max=1.0,learning_rate=0.08,lr_warmup_init=0.08,moving_average_decay=0.9'
                    ',clip_gradients_per_variable=false,lr_base_batch_size=2')
    config.override(overrides)
    return settings.finalize(config, settings.RunFacts(
        per_rank_batch=2, examples_per_epoch=200, num_epochs=10, seed=1))


@pytest.mark.slow  # Trains: 12 steps of the tiny model in this process.
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


def _bfloat16_ops(build):
    """Ops of the graph `build()` makes that make or take a bfloat16 tensor."""
    with tf.Graph().as_default() as graph:
        build()
    return [op.name for op in graph.get_operations()
            if any(t.dtype == tf.bfloat16 for t in list(op.outputs) + list(op.inputs))]


def test_predict_computes_in_float32_when_training_uses_bfloat16():
    # As Habana's port: --use_amp trains in bfloat16, evaluation and prediction run float32.
    params = _tiny_params(mixed_precision=True)
    assert params.runtime.compute_dtype == 'bfloat16'  # The CPU's half type.
    assert _bfloat16_ops(lambda: det_model_fn.model_fn(
        {'images': tf.zeros([2, 128, 128, 3])}, None, tf1.estimator.ModeKeys.PREDICT,
        params)) == []
    # The same network in training mode is bfloat16: the check sees it.
    assert len(_bfloat16_ops(lambda: det_model_fn._build_network(
        {'images': tf.zeros([2, 128, 128, 3])}, params,
        is_training=True))) > 100


def test_float16_overflow_skips_the_step_and_lowers_the_loss_scale():
    """An overflow injected in float16 math on CPU: the scaled gradient of 4 * w is 4 x 2^15,
    over float16's 65504, and 4 x 2^14 = 65536 still is; at 2^13 it fits. The two overflowing
    steps leave the weights, the step counter and the EMA alone, halve the scale and do not
    stop training; the third applies the true gradient (4), not the scaled one."""
    from efficientdet_hpu.training import loss_scale
    with tf.Graph().as_default():
        weight = tf1.get_variable('w', initializer=1.0)
        loss = tf.cast(tf.cast(weight, tf.float16) * tf.constant(4.0, tf.float16), tf.float32)
        config = hparams_config.get_efficientdet_config()
        config.override(dict(optimizer='sgd', momentum=0.0, moving_average_decay=0.9,
                             clip_gradients_norm=0.0))
        params = settings.finalize(config, settings.RunFacts(use_amp=True,
                                                             half_dtype='float16'))
        train_op, _, keep_going = det_model_fn._train_op(loss, params, learning_rate=0.01)
        scale = [v for v in tf1.global_variables() if v.name == 'loss_scale/scale:0'][0]
        step = tf1.train.get_or_create_global_step()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            assert session.run(scale) == loss_scale.INITIAL_SCALE
            for expected_scale in (2.0 ** 14, 2.0 ** 13):
                applied, going = session.run([train_op, keep_going])
                assert not applied and going
                assert session.run([weight, step, scale]) == [1.0, 0, expected_scale]
            applied, going = session.run([train_op, keep_going])
            assert applied and going
            assert session.run(step) == 1 and session.run(scale) == 2.0 ** 13
            assert abs(session.run(weight) - (1.0 - 0.01 * 4.0)) < 1e-6


def test_float16_loss_scale_grows_after_a_run_of_finite_steps():
    from efficientdet_hpu.training import loss_scale
    with tf.Graph().as_default():
        scaler = loss_scale.DynamicLossScale(initial_scale=8.0, growth_interval=3)
        finite = tf1.placeholder(tf.bool, [])
        update = scaler.update(finite)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            scales = []
            for value in (True, True, True, True, False, False, False, False, False):
                session.run(update, {finite: value})
                scales.append(session.run(scaler.scale))
            assert scales == [8.0, 8.0, 16.0, 16.0, 8.0, 4.0, 2.0, 1.0, 1.0]
            assert session.run(scaler.exhausted())


def test_ema_shadows_and_update_equal_tensorflows_exponential_moving_average(tmp_path):
    """checkpoints.checkpoints.ema_shadows/ema_update (built without a tf.cond per variable) give
    TensorFlow's EMA names and values bit for bit: the shadow starts at the variable's initial
    value (also when a warm start replaces it) and follows the num_updates-capped decay."""
    from efficientdet_hpu.checkpoints import checkpoints
    tf1 = tf.compat.v1
    warm = tmp_path / 'warm'
    with tf.Graph().as_default(), tf1.Session() as session:
        tf1.get_variable('b', initializer=np.float32([7.0, -3.0, 0.5]))
        session.run(tf1.global_variables_initializer())
        tf1.train.Saver().save(session, str(warm / 'model.ckpt'))

    def run(ours):
        with tf.Graph().as_default():
            step = tf1.train.get_or_create_global_step()
            a = tf1.get_variable('a', [4, 3], initializer=tf1.random_normal_initializer(seed=3))
            b = tf1.get_variable('b', [3], initializer=tf1.zeros_initializer())
            tf1.train.init_from_checkpoint(str(warm / 'model.ckpt'), {'b': b})
            variables = [a, b]
            if ours:
                shadows = checkpoints.ema_shadows(variables)
            target = tf1.placeholder(tf.float32, [])
            with tf.control_dependencies([a.assign_add(tf.ones_like(a) * target),
                                          b.assign_sub(tf.ones_like(b) * target * 0.3),
                                          step.assign_add(1)]):
                if ours:
                    update = checkpoints.ema_update(variables, shadows, 0.9998, step)
                else:
                    ema = tf1.train.ExponentialMovingAverage(0.9998, num_updates=step)
                    update = ema.apply(variables)
                    shadows = [ema.average(v) for v in variables]
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                history = [session.run(shadows)]
                for value in (0.5, -1.25, 3.0, 0.125):
                    session.run(update, {target: value})
                    history.append(session.run(shadows))
            return [s.op.name for s in shadows], history

    names, ours = run(True)
    reference_names, reference = run(False)
    assert names == reference_names == ['a/ExponentialMovingAverage', 'b/ExponentialMovingAverage']
    np.testing.assert_array_equal(ours[0][1], [7.0, -3.0, 0.5])  # The warm-started value.
    for got, expected in zip(ours, reference):
        for got_value, expected_value in zip(got, expected):
            np.testing.assert_array_equal(got_value, expected_value)
    assert not np.array_equal(ours[0][0], ours[-1][0])  # The shadows did move.


@pytest.mark.slow  # Trains: 2 steps of the tiny model in this process.
def test_var_freeze_expr_keeps_the_backbone_still_while_the_rest_trains(tiny_dataset):
    params = _tiny_params(var_freeze_expr='efficientnet', num_classes=4)  # 4: the labels'.
    with tf.Graph().as_default():
        tf1.set_random_seed(1)
        reader = dataloader.InputReader(tiny_dataset['train_pattern'], is_training=True,
                                        deterministic=True, seed=3)
        features, labels = tf1.data.make_one_shot_iterator(reader(params)).get_next()
        spec = det_model_fn.model_fn(features, labels, tf1.estimator.ModeKeys.TRAIN, params)
        trainable = tf1.trainable_variables()
        frozen = [v for v in trainable if v.name.startswith('efficientnet')]
        assert frozen and len(frozen) < len(trainable)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            before = session.run(trainable)
            for _ in range(2):
                session.run(spec.train_op)
            after = session.run(trainable)
    moved = {v.name for v, b, a in zip(trainable, before, after) if not np.array_equal(b, a)}
    assert not moved & {v.name for v in frozen}
    # Most of the rest moves in two steps (a few batch-norm offsets and fusion weights whose
    # gradient is zero on this batch may not).
    others = {v.name for v in trainable} - {v.name for v in frozen}
    assert len(moved) >= 0.8 * len(others), sorted(others - moved)
    for head in ('class_net/class-predict/', 'box_net/box-predict/'):
        assert any(name.startswith(head) for name in moved), head
