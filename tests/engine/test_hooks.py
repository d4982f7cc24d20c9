"""engine/hooks.py in real Estimator.train() calls of the tiny model (tests/tiny_engine.py),
through loops.train_until: the training log (lines, JSON log, memory CSV, the final weights
checksum), the summaries, the profiler window, the finite guard (a planted NaN loss) and the
finite-weights listener."""
import contextlib
import csv
import glob
import io
import os

import pytest
import tensorflow as tf

import tiny_engine
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.engine import hooks
from efficientdet_hpu.engine import loops
from efficientdet_hpu.engine import train_log as run_log
from tiny_engine import TinyModel, checkpoint_steps, engine_options

tf1 = tf.compat.v1


@pytest.fixture(scope='module')
def val_pattern(tmp_path_factory):
    return tiny_engine.write_val_shards(tmp_path_factory.mktemp('val'))


@pytest.fixture(scope='module')
def three_steps(val_pattern, tmp_path_factory):
    """One train() call of 3 steps (of 7), logged every 2, summaries every 2, the profiler on
    step 2. Read only."""
    model_dir = str(tmp_path_factory.mktemp('hooks') / 'model')
    options = engine_options(model_dir, val_pattern, mode='train', log_every_n_steps=2,
                             iterations_per_loop=2, profile_steps='2,2')
    with tiny_engine.log_lines() as logged, contextlib.redirect_stdout(io.StringIO()):
        with tiny_engine.tiny_run(options, TinyModel()) as run:
            loops.train_until(run, 3)
    return dict(model_dir=model_dir, logged=logged)


def _shift_before(step):
    """The tiny model's shift before 1-based `step` (0.4, times 0.7 each step)."""
    return 0.4 * 0.7 ** (step - 1)


def test_training_log_lines_and_records_at_the_interval_and_the_stop_step(three_steps):
    model_dir = three_steps['model_dir']
    records = [r for r in run_log.read_json_log(model_dir) if r['event'] == 'train']
    assert [r['step'] for r in records] == [2, 3]  # Step 1 starts the clock; 3 is the stop.
    for record in records:
        # Each record holds the scalars of its step, fetched before that step's update.
        shift = _shift_before(record['step'])
        assert record['loss'] == pytest.approx(0.5 * shift ** 2, rel=1e-5)
        assert record['grad_norm'] == pytest.approx(shift, rel=1e-5)
        assert record['learning_rate'] == pytest.approx(0.3)
        assert record['total_steps'] == 7 and record['images_per_sec'] > 0
        assert set(det_model_fn.TRAIN_LOG_KEYS) <= set(record)
    lines = [line for line in three_steps['logged'] if line.startswith('step ')]
    assert [line.split(' loss')[0] for line in lines] == ['step 2/7', 'step 3/7']
    assert lines[0].startswith('step 2/7 loss %.4f (cls %.4f box 0.00000) lr 0.30000 ' % (
        records[0]['loss'], records[0]['loss']))
    assert ' images/s ETA 0:00:' in lines[0]
    with open(os.path.join(model_dir, run_log.MEMORY_CSV)) as f:
        assert [row['step'] for row in csv.DictReader(f)] == ['2', '3']
    # The final weights' checksum: sum of |w| over the trainable variables, here |shift|.
    (checksum,) = [line for line in three_steps['logged'] if line.startswith('final weights')]
    value = float(checksum.rsplit(' ', 1)[1])
    assert checksum.startswith('final weights at step 3: checksum ')
    assert value == pytest.approx(abs(tf.train.load_variable(
        os.path.join(model_dir, 'model.ckpt-3'), tiny_engine.SHIFT)), rel=1e-6)


def test_summaries_at_the_first_step_and_every_n_after(three_steps):
    values, starts = {}, 0
    for path in glob.glob(os.path.join(three_steps['model_dir'], 'events.out.tfevents.*')):
        for event in tf1.train.summary_iterator(path):
            starts += event.session_log.status == tf1.SessionLog.START
            for value in event.summary.value:
                values.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert starts == 1
    # The global step before the update: 0 (step 1) and 2 (step 3).
    assert [step for step, _ in values['train/shift']] == [0, 2]
    assert [v for _, v in values['train/shift']] == pytest.approx(
        [_shift_before(1), _shift_before(3)], rel=1e-6)
    assert [step for step, _ in values['train/images_per_sec']] == [2, 3]


def test_profiler_window_traces_the_steps_asked(three_steps):
    profile = os.path.join(three_steps['model_dir'], 'profile')
    assert glob.glob(os.path.join(profile, 'plugins', 'profile', '*', '*.xplane.pb'))
    assert 'profiler trace of steps 2..2 written under %s' % profile in three_steps['logged']


def test_parse_profile_steps():
    assert hooks.parse_profile_steps('2,5') == (2, 5)
    assert hooks.parse_profile_steps('3,3') == (3, 3)
    with pytest.raises(ValueError, match=r'--profile_steps=2 must be START,END, e\.g\. 10,15'):
        hooks.parse_profile_steps('2')
    with pytest.raises(ValueError, match=r'--profile_steps=a,b must be START,END'):
        hooks.parse_profile_steps('a,b')
    for text in ('0,3', '5,2'):
        with pytest.raises(ValueError, match='needs 1 <= START <= END'):
            hooks.parse_profile_steps(text)


def test_a_nan_loss_stops_training_at_its_step_and_keeps_the_last_checkpoint(val_pattern,
                                                                             tmp_path):
    """Checkpoints every 2 steps; step 4's loss is NaN: the guard stops there, before the
    Estimator's NanTensorHook, and model.ckpt-2 stays the newest."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, mode='train', cp_every_n_steps=2)
    with tiny_engine.tiny_run(options, TinyModel(nan_at_step=4)) as run:
        with pytest.raises(hooks.NonFiniteLossError) as raised:
            loops.train_until(run, 7)
    assert str(raised.value) == (
        'loss became nan at step 4 (non-finite: cls_loss nan; learning rate 0.3); the update '
        'of that step was skipped and the last finite checkpoint model.ckpt-2 is kept; '
        + hooks.DIVERGENCE_ADVICE)
    assert checkpoint_steps(model_dir) == [0, 2]
    assert tf.train.load_variable(os.path.join(model_dir, 'model.ckpt-2'),
                                  'global_step') == 2


def test_non_finite_weights_are_never_checkpointed(val_pattern, tmp_path):
    """A learning rate that overflows float32 takes the finite loss of step 1 to inf weights:
    the checkpoint of step 1 is refused before it is written."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, mode='train', cp_every_n_steps=1)
    with tiny_engine.tiny_run(options, TinyModel(learning_rate=1e39)) as run:
        with pytest.raises(hooks.NonFiniteLossError) as raised:
            loops.train_until(run, 7)
    assert str(raised.value) == (
        'the weights became non-finite at step 1 with a finite loss; that checkpoint was not '
        'written and the last finite checkpoint model.ckpt-0 is kept; '
        + hooks.DIVERGENCE_ADVICE)
    assert checkpoint_steps(model_dir) == [0]
