"""engine/loops.py in one process with the tiny model (tests/tiny_engine.py): the epochs of
train_and_eval (ends at int(epoch x steps per epoch), the last at the total, evaluated inside
one train() call; a rerun skips the finished ones; early stopping), train with
eval_after_training, train_until, the resume and nothing-to-train lines, the wall time
line and record, and the disk-full line."""
import contextlib
import dataclasses
import errno
import io
import os
import shutil

import pytest
import tensorflow as tf

import tiny_engine
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.engine import loops
from efficientdet_hpu.engine import train_log as run_log
from efficientdet_hpu.engine import wall_time
from tiny_engine import TinyModel, checkpoint_steps, engine_options, logged_steps

tf1 = tf.compat.v1


def _execute(options, model):
    """loops.execute of a tiny run: (exit status, printed text, logged lines)."""
    printed = io.StringIO()
    with tiny_engine.log_lines() as logged, contextlib.redirect_stdout(printed):
        with tiny_engine.tiny_run(options, model) as run:
            status = loops.execute(run)
    return status, printed.getvalue(), logged


@pytest.fixture(scope='module')
def val_pattern(tmp_path_factory):
    return tiny_engine.write_val_shards(tmp_path_factory.mktemp('val'))


@pytest.fixture(scope='module')
def tiny_train_and_eval(val_pattern, tmp_path_factory):
    """One train_and_eval run of 3 epochs of 2.5 steps whose AP rises epoch after epoch
    (the shift shrinks by 0.7 a step); read only (tests that rerun it copy it)."""
    model_dir = tmp_path_factory.mktemp('train_and_eval') / 'model'
    model = TinyModel()
    status, printed, logged = _execute(engine_options(model_dir, val_pattern), model)
    return dict(model_dir=str(model_dir), status=status, printed=printed, logged=logged,
                builds=dict(model.builds))


def test_train_and_eval_ends_epochs_at_int_of_epoch_times_steps_per_epoch(tiny_train_and_eval):
    """2.5 steps an epoch, 7 steps: epochs end at int(2.5) = 2, int(5.0) = 5 and the total 7;
    one train() call (its first step only starts the log's clock) evaluates the checkpoint
    it writes at each of them, every step logged (log_every_n_steps=1)."""
    run = tiny_train_and_eval
    assert run['status'] == 0
    assert checkpoint_steps(run['model_dir']) == [0, 2, 5, 7]
    assert logged_steps(run['model_dir'], 'eval') == [2, 5, 7]
    assert logged_steps(run['model_dir'], 'train') == [2, 3, 4, 5, 6, 7]
    assert ('train_and_eval: evaluations at steps 2, 5 and 7, in the training session'
            in run['logged'])
    assert run['builds'] == {'train': 1, 'infer': 1}  # Each graph built once.
    for step in (2, 5, 7):
        assert 'COCO evaluation of model.ckpt-%d (step %d, 5 images)' % (step, step) in (
            run['printed'])
        assert os.path.isfile(os.path.join(run['model_dir'], 'eval', 'metrics-%d.json' % step))
    # A new model_dir: nothing to resume, nothing said about it.
    assert not [line for line in run['logged'] if line.startswith('resuming from')]
    assert 'nothing to train' not in run['printed']


def test_each_epoch_is_scored_on_the_ema_weights_of_its_checkpoint(tiny_train_and_eval):
    model_dir = tiny_train_and_eval['model_dir']
    aps = []
    for step in (2, 5, 7):
        checkpoint = os.path.join(model_dir, 'model.ckpt-%d' % step)
        ap = tiny_engine.read_metrics(model_dir, step)['AP']
        assert ap == pytest.approx(tiny_engine.direct_metrics(checkpoint)['AP'], abs=1e-12)
        assert ap == tiny_engine.hand_ap(tiny_engine.ema_shift(checkpoint))
        aps.append(ap)
    # The raw weights would have scored otherwise: the EMA really was restored.
    raw = [tiny_engine.hand_ap(tf.train.load_variable(
        os.path.join(model_dir, 'model.ckpt-%d' % step), tiny_engine.SHIFT)) for step in (2, 5, 7)]
    assert raw != aps
    assert aps == sorted(aps) and aps[0] < aps[-1]
    assert tiny_engine.best_record(model_dir)['step'] == 7


def test_a_rerun_with_more_epochs_trains_and_evaluates_only_the_new_one(tiny_train_and_eval,
                                                                        val_pattern, tmp_path):
    """4 epochs: ends at 2, 5, 7 and 10; the first three are done, so the rerun resumes at 7
    and evaluates once, at 10."""
    model_dir = str(tmp_path / 'model')
    shutil.copytree(tiny_train_and_eval['model_dir'], model_dir)
    status, printed, logged = _execute(engine_options(model_dir, val_pattern, num_epochs=4),
                                       TinyModel())
    assert status == 0
    assert 'resuming from %s/model.ckpt-7 (step 7)' % model_dir in logged
    assert checkpoint_steps(model_dir) == [0, 2, 5, 7, 10]
    assert logged_steps(model_dir, 'eval') == [2, 5, 7, 10]
    assert logged_steps(model_dir, 'train') == [2, 3, 4, 5, 6, 7, 9, 10]
    assert printed.count('COCO evaluation of') == 1
    assert 'train_and_eval: evaluations at step 10, in the training session' in logged


def test_early_stop_ends_training_at_the_patience_and_a_rerun_says_so_again(val_pattern,
                                                                             tmp_path):
    """The shift grows from 0 towards 1: the AP falls after the first epoch; patience 1 stops
    after the second evaluation, before the third epoch."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, early_stop_patience=1)
    falling = TinyModel(initial_shift=0.0, target_shift=1.0, learning_rate=0.05)
    status, printed, _ = _execute(options, falling)
    assert status == 0
    assert checkpoint_steps(model_dir) == [0, 2, 5]
    first, second = (tiny_engine.read_metrics(model_dir, step)['AP'] for step in (2, 5))
    assert second < first
    line = ('early stop at step 5: AP %.4f of step 2 not beaten in the 1 evaluations after it '
            '(--early_stop_patience=1); best checkpoint in %s' % (
                first, os.path.join(model_dir, 'best')))
    assert line in printed.splitlines()
    assert logged_steps(model_dir, 'early_stop') == [5]
    assert tiny_engine.best_record(model_dir)['step'] == 2

    status, printed, _ = _execute(options, falling)
    assert status == 0 and line in printed.splitlines()
    assert 'COCO evaluation of' not in printed
    assert checkpoint_steps(model_dir) == [0, 2, 5]
    assert logged_steps(model_dir, 'early_stop') == [5]  # Recorded once.


def test_train_until_then_train_with_eval_after_training_then_nothing_to_train(val_pattern,
                                                                                tmp_path):
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, mode='train', eval_after_training=True)
    with tiny_engine.log_lines() as logged, tiny_engine.tiny_run(options, TinyModel()) as run:
        loops.train_until(run, 3)
        assert loops.current_step(run) == 3
        loops.train_until(run, 3)  # Reached: no train() call.
        assert logged_steps(model_dir, 'train') == [2, 3]
        assert loops.execute(run) == 0
    assert 'resuming from %s/model.ckpt-3 (step 3)' % model_dir in logged
    assert checkpoint_steps(model_dir) == [0, 3, 7]
    assert logged_steps(model_dir, 'train') == [2, 3, 5, 6, 7]
    assert logged_steps(model_dir, 'eval') == [7]

    status, printed, _ = _execute(dataclasses.replace(options, eval_after_training=False),
                                  TinyModel())
    assert status == 0
    assert ('model.ckpt-7 is already at the last step (7 of 7): nothing to train; raise '
            '--num_epochs to go on') in printed.splitlines()
    assert checkpoint_steps(model_dir) == [0, 3, 7]
    assert logged_steps(model_dir, 'train') == [2, 3, 5, 6, 7]


def _write_checkpoint(model_dir, step):
    """A real checkpoint model_dir/model.ckpt-<step> of one variable; returns its prefix."""
    with tf.Graph().as_default():
        tf1.get_variable('w', initializer=tf.zeros([256]))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            return tf1.train.Saver().save(session, os.path.join(model_dir, 'model.ckpt'),
                                          global_step=step)


def test_disk_full_message_names_the_checkpoint_to_resume_from_and_drops_partial_ones(tmp_path):
    model_dir = str(tmp_path)
    latest = _write_checkpoint(model_dir, 4)
    partial = tmp_path / 'model.ckpt-6_temp_0123abcd'
    partial.mkdir()
    assert loops.disk_full_message(ValueError('shapes differ'), model_dir) is None
    assert partial.exists()  # Only an out-of-space error clears them.
    needed = sum(os.path.getsize(os.path.join(model_dir, name)) for name in os.listdir(model_dir)
                 if name.startswith('model.ckpt-4.'))
    error = OSError(errno.ENOSPC, 'No space left on device',
                    os.path.join(model_dir, 'model.ckpt-6.index'))
    message = loops.disk_full_message(error, model_dir)
    assert message.startswith('no space left on the device writing %s/model.ckpt-6.index ('
                              % model_dir)
    expected = (', about %d bytes needed); free space there (or use another --model_dir) and '
                'rerun the same command: it resumes from %s' % (needed,
                                                                os.path.basename(latest)))
    assert message.endswith(expected), message
    assert not partial.exists()
    assert checkpoints.latest_checkpoint(model_dir) == latest


def test_disk_full_message_without_a_checkpoint_resumes_from_the_start(tmp_path):
    message = loops.disk_full_message(OSError(errno.EDQUOT, 'Disk quota exceeded'), str(tmp_path))
    assert message.endswith('rerun the same command: it resumes from the start')
    assert 'needed' not in message


def test_the_run_ends_with_where_its_wall_time_went(tiny_train_and_eval):
    """One line (printed last) and one JSON log record: start-up, training steps,
    evaluations, checkpoints and the rest, which add up to the wall time."""
    model_dir = tiny_train_and_eval['model_dir']
    (record,) = [r for r in run_log.read_json_log(model_dir) if r['event'] == 'wall_time']
    assert (record['mode'], record['step']) == ('train_and_eval', 7)
    # 7 steps (the first in start-up), 3 evaluations, checkpoints of steps 0, 2, 5 and 7.
    assert (record['training_steps'], record['evaluations'], record['checkpoints']) == (7, 3, 4)
    parts = [record[key + '_sec'] for key in ('startup', 'steps', 'evaluations', 'checkpoints',
                                              'other')]
    assert min(parts) >= 0 and record['startup_sec'] > 0 and record['evaluations_sec'] > 0
    assert sum(parts) == pytest.approx(record['wall_sec'], rel=1e-9)
    assert record['cpu_sec'] > 0
    line = tiny_train_and_eval['printed'].splitlines()[-1]
    assert line == wall_time.summary_line(record)
    assert line.startswith('wall time %.1f s: start-up ' % record['wall_sec'])
    assert ', evaluations %.1f s (' % record['evaluations_sec'] in line and ', 3), ' in line
