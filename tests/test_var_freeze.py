"""var_freeze_expr (training/var_freeze.py): automl's re.match semantics, errors, the config key,
and a real optimizer step in which the frozen variables do not move and the others do."""
import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import automl_config
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import model_params
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
        params = model_params.ModelParams(config, model_params.RunParams(batch_size=1))
        train_op, _, _ = det_model_fn._train_op(loss, params, learning_rate=0.1)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(train_op)
            session.run(train_op)
            values = session.run(weights)
    # Only box_net/w trains: two SGD steps of gradient 3 at rate 0.1 give 1 - 2 * 0.3.
    np.testing.assert_allclose(values, [1.0, 1.0, 0.4], rtol=1e-6)
