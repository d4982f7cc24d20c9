"""checkpoints/checkpoint_integrity.py on small real checkpoints written by a tf.compat.v1 Saver
(steps 10 and 20, relative paths as the Estimator writes them), damaged as file systems damage
them: a cut data file, an index of garbage, a tensor missing, all of them."""
import os

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.checkpoints import checkpoint_integrity
from efficientdet_hpu.checkpoints.checkpoints import CheckpointError

tf1 = tf.compat.v1


def _save(model_dir, step, names):
    """Saves model.ckpt-STEP holding `names`; `checkpoint` lists every checkpoint saved so
    far, as an Estimator's Saver (which recovers the earlier ones) lists them."""
    listed = checkpoint_integrity.listed_checkpoints(model_dir)
    with tf.Graph().as_default():
        for index, name in enumerate(names):
            tf1.get_variable(name, initializer=np.full([1000], index, np.float32))
        global_step = tf1.train.get_or_create_global_step()
        saver = tf1.train.Saver(save_relative_paths=True, max_to_keep=5)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(global_step.assign(step))
            saver.save(session, os.path.join(model_dir, 'model.ckpt'), global_step=step)
    names = [os.path.basename(p) for p in reversed(listed)] + ['model.ckpt-%d' % step]
    tf1.train.update_checkpoint_state(model_dir, names[-1], all_model_checkpoint_paths=names)


@pytest.fixture
def model_dir(tmp_path):
    for step in (10, 20):
        _save(str(tmp_path), step, ['a', 'b', 'c'])
    return str(tmp_path)


def _prefix(model_dir, step):
    return os.path.join(model_dir, 'model.ckpt-%d' % step)


def _cut(prefix):
    (data,) = tf.io.gfile.glob(prefix + '.data-*')
    os.truncate(data, os.path.getsize(data) - 100)


def test_an_intact_run_is_left_as_it_is(model_dir):
    before = sorted(os.listdir(model_dir))
    assert checkpoint_integrity.damage(_prefix(model_dir, 20)) is None
    assert checkpoint_integrity.recover(model_dir) is None
    assert sorted(os.listdir(model_dir)) == before


def test_a_cut_data_file_is_set_aside_and_the_older_one_listed(model_dir):
    _cut(_prefix(model_dir, 20))
    line = checkpoint_integrity.recover(model_dir)
    assert line.startswith('model.ckpt-20 is damaged: tensor ')
    assert 'cannot be read from model.ckpt-20.data-00000-of-00001 (' in line
    assert line.endswith('(moved to %s/damaged); resuming from model.ckpt-10' % model_dir)
    assert tf.train.latest_checkpoint(model_dir) == _prefix(model_dir, 10)
    state = tf.train.get_checkpoint_state(model_dir)
    assert list(state.all_model_checkpoint_paths) == [_prefix(model_dir, 10)]
    assert sorted(os.listdir(os.path.join(model_dir, 'damaged'))) == [
        'model.ckpt-20.data-00000-of-00001', 'model.ckpt-20.index', 'model.ckpt-20.meta']


def test_an_unreadable_index_is_named(model_dir):
    with open(_prefix(model_dir, 20) + '.index', 'wb') as f:
        f.write(b'\0garbage' * 10)
    why = checkpoint_integrity.damage(_prefix(model_dir, 20))
    assert why.startswith('its index model.ckpt-20.index is unreadable ('), why


def test_a_checkpoint_lacking_a_tensor_of_the_run_is_damaged(tmp_path):
    _save(str(tmp_path), 10, ['a', 'b', 'c'])
    _save(str(tmp_path), 20, ['a', 'c'])  # As if 'b' were lost.
    intact, damaged = checkpoint_integrity.newest_intact(str(tmp_path))
    assert intact == _prefix(str(tmp_path), 10)
    assert damaged == [(_prefix(str(tmp_path), 20),
                        'it lacks tensor b that model.ckpt-10 holds')]


def test_none_intact_is_one_error_and_nothing_moves(model_dir):
    for step in (10, 20):
        _cut(_prefix(model_dir, step))
    before = sorted(os.listdir(model_dir))
    with pytest.raises(CheckpointError) as raised:
        checkpoint_integrity.recover(model_dir)
    message = str(raised.value)
    assert message.startswith('--model_dir=%s holds no intact checkpoint (model.ckpt-20 is '
                              'damaged: tensor ' % model_dir)
    assert '; model.ckpt-10 is damaged: tensor ' in message
    assert sorted(os.listdir(model_dir)) == before


def test_reading_a_damaged_checkpoint_names_the_intact_one(model_dir):
    _cut(_prefix(model_dir, 20))
    with pytest.raises(CheckpointError, match='pass --checkpoint=%s ' % _prefix(model_dir, 10)):
        checkpoint_integrity.check_for_reading(_prefix(model_dir, 20), '--checkpoint=%s')
    checkpoint_integrity.check_for_reading(_prefix(model_dir, 10), '--checkpoint=%s')


def test_a_relative_model_dir_is_read_as_given(model_dir, monkeypatch):
    # `make demo` trains into runs/demo: a rerun (resume) or predict --model_dir=runs/demo
    # must find its checkpoints, not runs/demo/runs/demo/model.ckpt-N.
    monkeypatch.chdir(os.path.dirname(model_dir))
    relative = os.path.basename(model_dir)
    assert checkpoint_integrity.listed_checkpoints(relative) == [
        os.path.join(relative, 'model.ckpt-20'), os.path.join(relative, 'model.ckpt-10')]
    checkpoint_integrity.check_for_reading(os.path.join(relative, 'model.ckpt-20'), '--ckpt=%s')
    assert checkpoint_integrity.newest_intact(relative) == (
        os.path.join(relative, 'model.ckpt-20'), [])
