"""var_freeze_expr (training/var_freeze.py): automl's re.match semantics, errors, the config key,
and a real optimizer step in which the frozen variables do not move and the others do."""
import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import automl_config
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.training import var_freeze

tf1 = tf.compat.v1


class _Named:
    def __init__(self, name):
        self.name = name


def test_re_match_is_anchored_at_the_start_only():
    names = ['efficientnet-lite0/stem/conv2d/kernel:0', 'fpn_cells/cell_0/WSM:0',
             'resample_p6/conv2d/kernel:0', 'class_net/class-predict/bias:0',
             'box_net/efficientnet_like/kernel:0']
    variables = [_Named(n) for n in names]
    kept = var_freeze.trainable(variables, '(efficientnet|fpn_cells|resample_p6)')
    # 'box_net/efficientnet_like' contains the word but does not start with it: trained.
    assert [v.name for v in kept] == names[3:]
    assert var_freeze.trainable(variables, '') == variables
    assert [v.name for v in var_freeze.trainable(variables, '.*kernel')] == names[1:2] + names[3:4]


def test_bad_expression_and_freezing_everything_are_user_errors():
    with pytest.raises(var_freeze.FreezeError, match=r"var_freeze_expr='\(efficientnet' is not"):
        var_freeze.trainable([_Named('a:0')], '(efficientnet')
    with pytest.raises(var_freeze.FreezeError, match='matches all 2 trainable variables'):
        var_freeze.trainable([_Named('a:0'), _Named('ab:0')], 'a')


def test_config_key_default_and_automl_null():
    config = hparams_config.get_efficientdet_config()
    assert config.var_freeze_expr == ''
    config.override({'var_freeze_expr': None})
    assert config.var_freeze_expr == ''
    config.override({'var_freeze_expr': 'efficientnet'})
    assert config.var_freeze_expr == 'efficientnet'
    # An automl config.yaml's key is carried over, not dropped as inert.
    expression = '(efficientnet|fpn_cells)'
    for automl_value, ours in ((None, ''), (expression, expression)):
        _, values = automl_config.project_values({'var_freeze_expr': automl_value})
        config.override({'var_freeze_expr': values['var_freeze_expr']})
        assert config.var_freeze_expr == ours


def test_a_real_step_moves_only_the_variables_left_trainable():
    with tf.Graph().as_default():
        names = ('efficientnet-b0/w', 'fpn_cells/w', 'box_net/w')
        weights = [tf1.get_variable(n, initializer=1.0) for n in names]
        loss = tf.add_n([(i + 1.0) * w for i, w in enumerate(weights)])
        config = hparams_config.get_efficientdet_config()
        config.override(dict(optimizer='sgd', momentum=0.0, moving_average_decay=0.9,
                             clip_gradients_norm=0.0, var_freeze_expr='(efficientnet|fpn)'))
        params = settings.finalize(config)
        train_op, _, _ = det_model_fn._train_op(loss, params, learning_rate=0.1)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train_op)
            session.run(train_op)
            values = session.run(weights)
    # Only box_net/w trains: two SGD steps of gradient 3 at rate 0.1 give 1 - 2 * 0.3.
    np.testing.assert_allclose(values, [1.0, 1.0, 0.4], rtol=1e-6)


def _three_weight_run(steps, **keys):
    """Weights after `steps` SGD steps (momentum 0.9, rate 0.1, global clipping to 1.5) of
    loss w_e + 2 w_f + 3 w_b; `keys` are hparams."""
    with tf.Graph().as_default():
        names = ('efficientnet-b0/w', 'fpn_cells/w', 'box_net/w')
        weights = [tf1.get_variable(n, initializer=1.0) for n in names]
        loss = tf.add_n([(i + 1.0) * w for i, w in enumerate(weights)])
        config = hparams_config.get_efficientdet_config()
        config.override(dict(dict(optimizer='sgd', momentum=0.9, moving_average_decay=0.9,
                                  clip_gradients_norm=1.5, clip_gradients_per_variable=False,
                                  var_freeze_expr='(efficientnet|fpn)'), **keys))
        params = settings.finalize(config)
        train_op, _, _ = det_model_fn._train_op(loss, params, learning_rate=0.1)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for _ in range(steps):
                session.run(train_op)
            return np.array(session.run(weights))


def test_a_freeze_for_the_first_steps_then_its_own_learning_rate():
    # The first phase equals automl's whole-run freeze exactly: the frozen gradients are zero
    # before the norm, so box_net's gradient 3 is clipped to 1.5 alone (not to 1.5 x 3 /
    # sqrt(14), as it would be if the frozen ones counted), momentum and all.
    frozen = _three_weight_run(2)
    phased = _three_weight_run(2, var_freeze_steps=2, var_freeze_lr_multiplier=0.5)
    np.testing.assert_allclose(phased, frozen, rtol=1e-6)
    np.testing.assert_allclose(frozen, [1.0, 1.0, 1.0 - 0.1 * 1.5 * (1 + 1.9)], rtol=1e-6)
    # Step 3: all three train; gradients (1, 2, 3) clipped together by 1.5 / sqrt(14), the
    # thawed ones at half the rate, from a zero momentum (they had only zero gradients).
    after = _three_weight_run(3, var_freeze_steps=2, var_freeze_lr_multiplier=0.5)
    clip = 1.5 / np.sqrt(14.0)
    box_velocity = 0.9 * 1.5 * 1.9 + 3 * clip  # Momentum 0.9: velocities 1.5, 2.85, this.
    np.testing.assert_allclose(after, [1 - 0.1 * 0.5 * clip, 1 - 0.1 * 0.5 * 2 * clip,
                                       1.0 - 0.1 * (1.5 * (1 + 1.9) + box_velocity)],
                               rtol=1e-5)


def test_freeze_phase_keys_without_an_expression_are_user_errors():
    for keys, message in (
            (dict(var_freeze_expr='', var_freeze_steps=5), 'need var_freeze_expr'),
            (dict(var_freeze_steps=0, var_freeze_lr_multiplier=0.1), 'set var_freeze_steps'),
            (dict(var_freeze_steps=-1), 'must be >= 0'),
            (dict(var_freeze_steps=2, var_freeze_lr_multiplier=0.1, optimizer='adam'),
             'needs optimizer sgd')):
        with pytest.raises(var_freeze.FreezeError, match=message):
            _three_weight_run(0, **keys)
