"""A model_dir as shared clusters leave it: the newest checkpoint damaged (its data file cut,
its index deleted), none intact, a checkpoint of another model, a second job on a model_dir a
live job holds. Each run is a real main.py (or inference.py) process on a copy of the shared
tiny run (checkpoints at steps 0 and 2)."""
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

import session_cache
from cli_runs import (TINY_HPARAMS, assert_one_line_error, run_main, run_python, started,
                      tiny_flags)
from test_distributed_resume import _wait_until

pytestmark = pytest.mark.slow  # main.py and inference.py processes.


def _copy(tiny_trained_run, tmp_path):
    model_dir = str(tmp_path / 'model')
    shutil.copytree(tiny_trained_run, model_dir)
    return model_dir


def _damage(prefix, how):
    if how == 'cut .data':
        (data,) = tf.io.gfile.glob(prefix + '.data-*')
        os.truncate(data, os.path.getsize(data) // 2)  # A copy that died half-way.
    else:
        os.remove(prefix + '.index')


@pytest.mark.parametrize('how, why', [
    ('cut .data', 'tensor '),  # ... cannot be read from model.ckpt-2.data-00000-of-00001 (N bytes)
    ('deleted .index', 'its index model.ckpt-2.index is missing')])
def test_a_damaged_newest_checkpoint_is_named_and_training_resumes_before_it(
        tiny_dataset, tiny_trained_run, tmp_path, how, why):
    model_dir = _copy(tiny_trained_run, tmp_path)
    _damage(os.path.join(model_dir, 'model.ckpt-2'), how)
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=2'))
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'WARNING model.ckpt-2 is damaged: %s' % why in result.stdout, result.stdout[-3000:]
    if how == 'cut .data':
        assert 'cannot be read from model.ckpt-2.data-00000-of-00001 (' in result.stdout
    assert ('(moved to %s/damaged); resuming from model.ckpt-0' % model_dir) in result.stdout
    assert 'resuming from %s/model.ckpt-0 (step 0)' % model_dir in result.stdout
    assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, 'model.ckpt-4')
    assert any(name.startswith('model.ckpt-2.') for name in os.listdir(model_dir + '/damaged'))


def test_no_intact_checkpoint_stops_in_one_line(tiny_dataset, tiny_trained_run, tmp_path):
    model_dir = _copy(tiny_trained_run, tmp_path)
    for step in (0, 2):
        _damage(os.path.join(model_dir, 'model.ckpt-%d' % step), 'cut .data')
    before = session_cache.fingerprint(model_dir)
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=2'))
    assert_one_line_error(result, 'holds no intact checkpoint', 'model.ckpt-2 is damaged',
                          'model.ckpt-0 is damaged', 'restore a copy',
                          starts_with='main.py: error: --model_dir=%s' % model_dir)
    assert not os.path.exists(os.path.join(model_dir, '.lock'))
    after = {entry[0] for entry in session_cache.fingerprint(model_dir)}
    assert {entry[0] for entry in before} <= after  # Nothing removed or moved.


def test_eval_and_export_name_the_damaged_checkpoint(tiny_dataset, tiny_trained_run, tmp_path):
    model_dir = _copy(tiny_trained_run, tmp_path)
    _damage(os.path.join(model_dir, 'model.ckpt-2'), 'cut .data')
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=eval', '--eval_timeout=1'))
    assert_one_line_error(result, '%s/model.ckpt-2 is damaged: tensor' % model_dir,
                          'move its files aside to use model.ckpt-0')
    result = run_python(['inference.py', 'export', '--model_dir=%s' % model_dir,
                         '--export_dir=%s' % (tmp_path / 'export')])
    assert_one_line_error(result, '%s/model.ckpt-2 is damaged: tensor' % model_dir,
                          'pass --checkpoint=%s/model.ckpt-0' % model_dir)
    assert not os.path.exists(tmp_path / 'export')


@pytest.mark.parametrize('change, says', [
    ('fpn_num_filters=24', 'fpn_num_filters 16 != 24'),  # Another width.
    ('num_classes=7', 'num_classes 4 != 7')])  # BiFPN depth: test_training.py.
def test_a_model_dir_of_another_model_stops_before_anything_is_written(
        tiny_dataset, tiny_trained_run, change, says):
    before = session_cache.fingerprint(tiny_trained_run)
    result = run_main(tiny_flags(tiny_dataset, tiny_trained_run, '--mode=train',
                                 '--num_epochs=2', hparams=TINY_HPARAMS + ',' + change))
    assert_one_line_error(result, 'holds a checkpoint of another model', says)
    assert session_cache.fingerprint(tiny_trained_run) == before


def test_another_variant_in_the_model_dir_is_refused(tiny_dataset, tiny_trained_run):
    result = run_main(tiny_flags(tiny_dataset, tiny_trained_run, '--mode=train',
                                 '--model_name=efficientdet-d1'))
    assert_one_line_error(result, 'holds a checkpoint of another model',
                          "name 'efficientdet-d0' != 'efficientdet-d1'")


def test_a_second_job_on_a_held_model_dir_is_refused_naming_the_first(tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'model')
    flags = tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=1000')
    log_path = str(tmp_path / 'first.log')
    with open(log_path, 'w') as log, started(
            [sys.executable, 'main.py'] + flags, stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')) as first:
        assert _wait_until(lambda: 'step 2/' in open(log_path).read()
                           or first.poll() is not None, 600), open(log_path).read()[-3000:]
        second = run_main(flags)
        assert_one_line_error(second, '--model_dir=%s is in use by another training job (host '
                              '%s, pid %d, started ' % (model_dir, socket.gethostname(),
                                                        first.pid), 'wait for it to end')
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM, open(log_path).read()[-3000:]
    assert not os.path.exists(os.path.join(model_dir, '.lock'))
