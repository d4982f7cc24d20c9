"""Gradient accumulation (training/accumulation.py, --gradient_accumulation_steps,
--global_batch_size): K micro-batches of b make the step of one batch of K x b, in one process
and under a real mpirun -np 2; the schedule follows the global batch; float16 overflows in any
micro-batch skip the step; the batch arithmetic's errors are one line."""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from cli_runs import REPO, TINY_HPARAMS, assert_one_line_error, run_main, run_process
from efficientdet_hpu.config import hparams_config, settings
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.engine import setup
from efficientdet_hpu.training import accumulation, det_model_fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fixtures'))
import accumulation_probe  # noqa: E402  pylint: disable=wrong-import-position

tf1 = tf.compat.v1
PROBE = accumulation_probe.__file__


def test_split_micro_batches_cuts_rows_in_order():
    with tf.Graph().as_default(), tf1.Session() as session:
        images = tf.reshape(tf.range(24.0), [6, 2, 2])
        labels = {'ids': tf.constant([10, 11, 12, 13, 14, 15])}
        pieces = session.run(accumulation.split_micro_batches((images, labels), 3))
        assert [list(p[1]['ids']) for p in pieces] == [[10, 11], [12, 13], [14, 15]]
        np.testing.assert_array_equal(pieces[2][0], np.arange(16.0, 24.0).reshape(2, 2, 2))
        with pytest.raises(ValueError, match='multiple of 4'):
            accumulation.split_micro_batches((images, labels), 4)


def test_float16_overflow_in_any_micro_batch_skips_the_whole_step():
    """Micro-batch 1 is finite at every scale; micro-batch 2's scaled gradient (4 x scale)
    overflows float16 at 2^15 and 2^14. Those steps change nothing and halve the scale; at
    2^13 the step applies the sum of both true gradients (1 + 4), once."""
    from efficientdet_hpu.training import loss_scale  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        weight = tf1.get_variable('w', initializer=1.0)

        def micro_batch_loss(factor):
            return tf.cast(tf.cast(weight, tf.float16) * tf.cast(factor, tf.float16),
                           tf.float32)
        config = hparams_config.get_efficientdet_config()
        config.override(dict(momentum=0.0, moving_average_decay=0.9, clip_gradients_norm=0.0))
        params = settings.finalize(config, settings.RunFacts(
            accumulation_steps=2, use_amp=True, half_dtype='float16'))
        train_op, _, keep_going = det_model_fn._train_op(
            micro_batch_loss(1.0), params, 0.01, [4.0], micro_batch_loss)
        scale = [v for v in tf1.global_variables() if v.name == 'loss_scale/scale:0'][0]
        step = tf1.train.get_or_create_global_step()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for expected_scale in (2.0 ** 14, 2.0 ** 13):
                applied, going = session.run([train_op, keep_going])
                assert not applied and going
                assert session.run([weight, step, scale]) == [1.0, 0, expected_scale]
            assert session.run(train_op)
            assert session.run(step) == 1
            assert abs(session.run(weight) - (1.0 - 0.01 * 5.0)) < 1e-6


def _options(tmp_path, **values):
    fields = dict.fromkeys(RunOptions.names())
    fields.update(mode='train', model_name='efficientdet-d0', model_dir=str(tmp_path),
                  hparams='', backbone_ckpt='', ckpt='', eval_batch_size=1, eval_samples=0,
                  use_fake_data=True, num_examples_per_epoch=64, num_epochs=4,
                  iterations_per_loop=100, log_every_n_steps=100, cp_every_n_steps=1000,
                  keep_checkpoint_max=5, eval_after_training=False, use_amp=False,
                  use_xla=False, deterministic=False, no_hpu=True, benchmark=False,
                  skip_bad_records=False, verbose=False, save_graph_def=False)
    fields.update(values)
    return RunOptions.from_values(fields)


def test_global_batch_size_derives_the_steps_and_names_a_bad_value():
    config = hparams_config.get_efficientdet_config()

    def derive(ranks, **flags):
        return settings.finalize(config, settings.RunFacts(ranks=ranks, per_rank_batch=2,
                                                           **flags))
    derived = derive(4, global_batch_size=64)
    assert (derived.batch.accumulation_steps, derived.batch.global_size) == (8, 64)
    # What model_dir/config.yaml records.
    assert derived.config.gradient_accumulation_steps == 8
    config.gradient_accumulation_steps = 3  # A recipe's key, used when no flag says otherwise.
    assert derive(1).batch.accumulation_steps == 3
    assert derive(1, accumulation_steps=2).batch.accumulation_steps == 2
    with pytest.raises(settings.SettingsError, match=r'--global_batch_size=60 is not a multiple '
                       r'of 4 ranks x --train_batch_size=2 = 8 images'):
        derive(4, global_batch_size=60)
    with pytest.raises(settings.SettingsError, match='disagrees'):
        derive(4, global_batch_size=64, accumulation_steps=2)
    with pytest.raises(settings.SettingsError, match='--train_batch_size=0 must be a positive'):
        settings.finalize(config, settings.RunFacts(per_rank_batch=0, global_batch_size=64))
    with pytest.raises(hparams_config.ConfigError, match='gradient_accumulation_steps'):
        hparams_config.validate(config.override({'gradient_accumulation_steps': 0}))


def test_a_recipe_may_give_the_global_batch_or_the_accumulation_steps(tmp_path):
    from efficientdet_hpu.config import recipe  # pylint: disable=import-outside-toplevel
    path = tmp_path / 'recipe.yaml'
    path.write_text('global_batch_size: 64\ngradient_accumulation_steps: 2\n')
    read = recipe.read_recipe(str(path))
    assert read.run_options == {'global_batch_size': 64}  # main.py's flag of that name.
    config = recipe.build_config('efficientdet-d0', read)
    assert config.gradient_accumulation_steps == 2


def _learning_rates(run, steps):
    """The learning rate model_fn builds for `run`, at each global step of `steps`."""
    params = run.settings
    with tf.Graph().as_default():
        reader = dataloader.InputReader(None, is_training=True, use_fake_data=True)
        features, labels = tf1.data.make_one_shot_iterator(reader(params)).get_next()
        assert features.shape[0] == 8  # Every micro-batch of the step, K x b.
        det_model_fn.model_fn(features, labels, tf1.estimator.ModeKeys.TRAIN, params)
        rate = tf1.get_collection(det_model_fn.TRAIN_LOG_COLLECTION)[
            det_model_fn.TRAIN_LOG_KEYS.index('learning_rate')]
        global_step = tf1.train.get_global_step()
        with tf1.Session() as session:  # The rate reads the step only.
            session.run(global_step.initializer)
            values = []
            for step in steps:
                global_step.load(step, session)
                values.append(session.run(rate))
    return values


@pytest.mark.slow  # Builds the tiny training graph twice in this process.
def test_learning_rate_schedule_follows_the_global_batch(tmp_path):
    """(batch 8, K 1) and (batch 2, K 4): the same global batch, steps per epoch, total steps
    and learning rate at step 0, the end of the warm-up, mid-way and the end."""
    runs = []
    for batch, steps in ((8, None), (2, 4)):
        options = _options(tmp_path / str(batch), train_batch_size=batch,
                           gradient_accumulation_steps=steps,
                           hparams=TINY_HPARAMS + ',lr_warmup_init=0.008,cosine_from_warmup_end=true')
        config = hparams_config.get_efficientdet_config().override(options.hparams)
        runs.append(setup.prepare(options, config, set()))
    for run in runs:
        assert (run.settings.batch.global_size, run.settings.schedule.steps_per_epoch,
                run.settings.schedule.total_steps) == (8, 8, 32)
    for run in runs:
        run.close()  # The model_dir locks and their refresher threads (tests/conftest.py).
    checkpoints = [0, 8, 20, 32]  # warm-up: 1 epoch of 8 steps; 4 epochs.
    big, accumulated = (_learning_rates(run, checkpoints) for run in runs)
    np.testing.assert_allclose(accumulated, big, rtol=1e-6)
    base = 0.08 * 8 / 64
    np.testing.assert_allclose(big, [base / 10, base, base / 2 * (1 + np.cos(np.pi / 2)), 0.0],
                               rtol=1e-5, atol=1e-8)


@pytest.fixture(scope='module')
def one_batch_step(tiny_dataset, tmp_path_factory):
    """A batch of 8 training images, the initial checkpoint and the weights after one step
    on all 8 at once (batch 8, K 1)."""
    root = tmp_path_factory.mktemp('accumulation')
    params = accumulation_probe.step_params(8, 1)
    with tf.Graph().as_default():
        reader = dataloader.InputReader(tiny_dataset['train_pattern'], is_training=True,
                                        deterministic=True, seed=3)
        batch = tf1.data.make_one_shot_iterator(reader(params)).get_next()
        with tf1.Session() as session:
            images, labels = session.run(batch)
    batch_path, checkpoint = str(root / 'batch.npz'), str(root / 'initial' / 'model.ckpt')
    accumulation_probe.save_batch(batch_path, images, labels)
    after = accumulation_probe.one_step(images, labels, params, checkpoint, save_initial=True)
    initial = tf.train.load_checkpoint(checkpoint)
    return dict(root=root, batch=batch_path, checkpoint=checkpoint, after=after,
                initial={name: initial.get_tensor(name) for name in after
                         if not name.startswith('log/') and name != 'step'})


def _assert_same_step(got, expected, initial):
    assert got['step'] == expected['step'] == 1
    # The step moves every kernel (weight decay alone: 0.08 x 0.01 of it) by over 10 times
    # the comparison's tolerance, so a decay added per micro-batch, or a wrong normaliser,
    # could not pass.
    kernels = [name for name in initial if name.endswith('kernel')]
    still = [name for name in kernels if np.abs(expected[name] - initial[name]).max()
             < 10 * (1e-5 * np.abs(expected[name]).max() + 1e-7)]
    assert len(kernels) > 50 and not still, still
    for name in initial:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    for name in ('l2_loss', 'grad_norm'):  # The step's, on every rank.
        np.testing.assert_allclose(got['log/' + name], expected['log/' + name], rtol=1e-5,
                                   err_msg=name)


def _assert_same_losses(per_rank, expected):
    """Each rank logs its share of the step's loss (its images' sum over the step's
    normaliser, times the ranks): their mean is the loss of the whole batch."""
    for name in ('cls_loss', 'box_loss'):
        np.testing.assert_allclose(np.mean([got['log/' + name] for got in per_rank]),
                                   expected['log/' + name], rtol=1e-5, err_msg=name)


@pytest.mark.slow  # Trains: one step of the tiny model twice in this process.
def test_four_micro_batches_of_two_equal_one_batch_of_eight(one_batch_step):
    images, labels = accumulation_probe.load_batch(one_batch_step['batch'])
    got = accumulation_probe.one_step(images, labels, accumulation_probe.step_params(2, 4),
                                      one_batch_step['checkpoint'])
    _assert_same_step(got, one_batch_step['after'], one_batch_step['initial'])
    _assert_same_losses([got], one_batch_step['after'])
    assert got['log/loss'] == pytest.approx(one_batch_step['after']['log/loss'], rel=1e-5)


@pytest.mark.slow  # A real mpirun -np 2.
def test_two_ranks_of_two_micro_batches_of_two_equal_one_process_of_eight(one_batch_step):
    out_dir = one_batch_step['root'] / 'ranks'
    out_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(('OMPI_', 'PMI'))}
    env.update(PYTHONPATH=REPO + os.pathsep + env.get('PYTHONPATH', ''), TF_CPP_MIN_LOG_LEVEL='2')
    command = ['mpirun', '--allow-run-as-root', '-np', '2', sys.executable, PROBE,
               one_batch_step['batch'], one_batch_step['checkpoint'], str(out_dir)]
    result = run_process(command, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-6000:]
    per_rank = [dict(np.load(out_dir / ('rank%d.npz' % rank))) for rank in (0, 1)]
    for got in per_rank:
        _assert_same_step(got, one_batch_step['after'], one_batch_step['initial'])
    _assert_same_losses(per_rank, one_batch_step['after'])


@pytest.mark.slow  # main.py in a subprocess (stops before building a graph).
def test_global_batch_size_not_divisible_is_one_line(tmp_path):
    result = run_main(['--mode=train', '--use_fake_data', '--model_dir=%s' % tmp_path,
                       '--train_batch_size=4', '--global_batch_size=10'])
    assert_one_line_error(result, '--global_batch_size=10', 'multiple of 4')
