"""config/settings.py: a run's configuration finalised once. Derived values by hand; the
frozen result; model_fn and the input read the Settings and nothing else; no library module
works a derived value out of the hparams on its own (the formulas live in `finalize` only)."""
import ast
import dataclasses
import os

import pytest
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.training import det_model_fn

tf1 = tf.compat.v1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(REPO, 'efficientdet_hpu')

# hparams that only feed derived values: reading them from a config is computing a derived
# value (scaled learning rate, warm-up and drop steps, total steps, accumulation, precision).
DERIVATION_INPUTS = ('learning_rate', 'lr_base_batch_size', 'lr_warmup_init', 'lr_warmup_epoch',
                     'first_lr_drop_epoch', 'second_lr_drop_epoch', 'num_epochs',
                     'mixed_precision', 'gradient_accumulation_steps')
# Where reading them is not a derivation: (module, function) -> why.
ALLOWED = {
    ('config/settings.py', '*'): 'the one place derived values are computed',
    ('config/hparams_config.py', '*'): 'defaults and validation of the keys themselves',
    ('engine/setup.py', 'run_summary'): "prints the recipe's rate beside the scaled one",
}


def _facts(**values):
    return settings.RunFacts(**dict(dict(ranks=2, per_rank_batch=4, accumulation_steps=2,
                                         examples_per_epoch=1000, num_epochs=3), **values))


def test_every_derived_value_by_hand():
    config = hparams_config.get_efficientdet_config().override(dict(
        learning_rate=0.08, lr_base_batch_size=64, lr_warmup_init=0.008, lr_warmup_epoch=1.0,
        first_lr_drop_epoch=2.0, second_lr_drop_epoch=2.5))
    final = settings.finalize(config, _facts(eval_per_rank_batch=3, seed=5))
    assert final.batch == settings.Batch(per_rank=4, accumulation_steps=2, ranks=2,
                                         global_size=16, eval_per_rank=3)
    assert final.batch.step_size == 8
    # 1000 / 16 = 62.5 steps per epoch; int(3 x 62.5) = 187; the rate x 16 / 64.
    assert final.schedule == settings.Schedule(
        steps_per_epoch=62.5, total_steps=187, learning_rate=pytest.approx(0.02),
        warmup_init=pytest.approx(0.002), warmup_steps=62, first_drop_step=125,
        second_drop_step=156)
    assert final.runtime.compute_dtype == 'float32' and final.runtime.seed == 5
    assert final.runtime.cross_rank_batch_norm  # sync_batch_norm (default) over 2 ranks.
    assert not settings.finalize(config, _facts(ranks=1)).runtime.cross_rank_batch_norm
    # What the run decided is recorded in the config (model_dir/config.yaml says it).
    assert final.config.gradient_accumulation_steps == 2
    assert final.config.mixed_precision is False
    assert config.gradient_accumulation_steps == 1  # The input config is left as it was.


def test_precision_is_decided_once_from_the_key_or_use_amp_and_the_device():
    config = hparams_config.get_efficientdet_config()
    amp = settings.finalize(config, _facts(use_amp=True, half_dtype='float16'))
    assert (amp.runtime.compute_dtype, amp.config.mixed_precision) == ('float16', True)
    recipe_amp = settings.finalize(config.override({'mixed_precision': True}), _facts())
    assert recipe_amp.runtime.compute_dtype == 'bfloat16'


def test_the_result_is_frozen_and_deep_copied_as_itself():
    final = settings.finalize(hparams_config.get_efficientdet_config(), _facts())
    with pytest.raises(TypeError, match='finalised'):
        final.config.num_classes = 3
    with pytest.raises(TypeError, match='finalised'):
        final.config.nms_configs.iou_thresh = 0.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        final.schedule.total_steps = 5
    # The Estimator deep-copies its params on every read.
    import copy  # pylint: disable=import-outside-toplevel
    assert copy.deepcopy(final) is final
    editable = hparams_config.Config(final.config.as_dict())
    editable.num_classes = 3
    assert editable.num_classes == 3 and final.config.num_classes == 90


def test_bad_batch_arithmetic_is_one_user_error_naming_the_flag():
    config = hparams_config.get_efficientdet_config()
    with pytest.raises(settings.SettingsError, match='--eval_batch_size=0 must be'):
        settings.finalize(config, _facts(eval_per_rank_batch=0))
    with pytest.raises(settings.SettingsError, match='--gradient_accumulation_steps=0 must be'):
        settings.finalize(config, _facts(accumulation_steps=0))
    with pytest.raises(hparams_config.ConfigError, match='image_size'):
        settings.finalize(config.override({'image_size': 100}), _facts())
    # --steps_file is read by one process; ranks would read it at different steps.
    config = hparams_config.get_efficientdet_config()
    with pytest.raises(settings.SettingsError, match='--steps_file is for one process; this '
                       'run has 2 ranks'):
        settings.finalize(config, _facts(ranks=2, steps_file='steps.json'))
    assert settings.finalize(config, _facts(ranks=1, steps_file='s.json')).runtime.steps_file == (
        's.json')


def _learning_rates(final, steps):
    with tf.Graph().as_default():
        step = tf1.placeholder(tf.int64, [])
        rate = det_model_fn.learning_rate_of_run(step, final)
        with tf1.Session() as session:
            return [float(session.run(rate, {step: s})) for s in steps]


def test_model_fn_and_the_input_read_the_settings_not_the_hparams():
    """Settings whose derived values disagree with what the hparams would give: the learning
    rate and the input batch follow the Settings, so nothing downstream recomputes them."""
    config = hparams_config.get_efficientdet_config().override(
        'image_size=128,max_level=5,lr_decay_method=constant')
    final = settings.finalize(config, _facts())
    planted = dataclasses.replace(
        final, schedule=dataclasses.replace(final.schedule, learning_rate=0.5),
        batch=dataclasses.replace(final.batch, per_rank=3, accumulation_steps=1))
    assert _learning_rates(planted, [0, 50]) == pytest.approx([0.5, 0.5])
    reader = dataloader.InputReader(None, is_training=True, use_fake_data=True)
    with tf.Graph().as_default():
        images, _ = tf1.data.make_one_shot_iterator(reader(planted)).get_next()
        assert images.shape[0] == 3


def _function_spans(tree):
    """[(first line, last line, name)] of the top-level functions and methods."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((node.lineno, node.end_lineno, node.name))
    return spans


def _config_reads(path):
    """(line, key, function) of each `<...config>.key` or `<...config>['key']` of a
    DERIVATION_INPUTS key in the module at `path`."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    spans = _function_spans(tree)
    found = []
    for node in ast.walk(tree):
        key, base = None, None
        if isinstance(node, ast.Attribute) and node.attr in DERIVATION_INPUTS:
            key, base = node.attr, node.value
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and node.slice.value in DERIVATION_INPUTS):
            key, base = node.slice.value, node.value
        if key is None or not ast.unparse(base).lower().endswith('config'):
            continue
        inner = [name for first, last, name in spans if first <= node.lineno <= last]
        found.append((node.lineno, key, inner[-1] if inner else '<module>'))
    return found


def test_no_library_module_derives_a_value_outside_finalize():
    misplaced = []
    for directory, _, names in os.walk(LIBRARY):
        for name in names:
            if not name.endswith('.py'):
                continue
            path = os.path.join(directory, name)
            module = os.path.relpath(path, LIBRARY)
            for line, key, function in _config_reads(path):
                if (module, '*') in ALLOWED or (module, function) in ALLOWED:
                    continue
                misplaced.append('%s:%d %s reads config.%s' % (module, line, function, key))
    assert not misplaced, ('derived values are computed in config/settings.finalize only; '
                           'read them from the Settings: %s' % misplaced)


def test_the_guard_sees_a_planted_derivation(tmp_path):
    path = tmp_path / 'planted.py'
    path.write_text('def scaled(params, batch):\n'
                    '    return params.config.learning_rate * batch / '
                    "params.config['lr_base_batch_size']\n")
    assert sorted((key, function) for _, key, function in _config_reads(str(path))) == [
        ('learning_rate', 'scaled'), ('lr_base_batch_size', 'scaled')]
