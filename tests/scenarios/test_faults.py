"""Faults made for real, as clusters and datasets make them: a shard cut short by an interrupted
copy, a record whose image bytes do not decode, a model_dir on a full disk, an evaluator whose
checkpoint is rotated out by the training job beside it. Each run is a real main.py process;
the tests assert the one-line message, the exit status and that the last good checkpoint
still loads."""
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from cli_runs import assert_one_line_error, run_main, run_process, started, tiny_flags, tmpfs_disk

pytestmark = pytest.mark.slow  # Every test trains or evaluates in a main.py process.

BAD_SOURCE_INDEX = 3


def _faulty_copy(tiny_dataset, tmp_path, truncate=False, bad_image=False):
    """A copy of the tiny dataset's TFRecords with the faults asked for; returns the dataset
    dict and (shard with the bad image, its source_id)."""
    records = tmp_path / 'records'
    shutil.copytree(os.path.dirname(tiny_dataset['train_pattern']), records)
    shards = sorted(glob.glob(str(records / 'train-*.tfrecord')))
    source_id = None
    if bad_image:
        examples = list(tf.data.TFRecordDataset(shards[0]).as_numpy_iterator())
        example = tf.train.Example.FromString(examples[BAD_SOURCE_INDEX])
        example.features.feature['image/encoded'].bytes_list.value[0] = b'\0not an image' * 9
        source_id = example.features.feature['image/source_id'].bytes_list.value[0].decode()
        examples[BAD_SOURCE_INDEX] = example.SerializeToString()
        with tf.io.TFRecordWriter(shards[0]) as writer:
            for serialized in examples:
                writer.write(serialized)
    if truncate:
        with open(shards[1], 'r+b') as f:
            f.truncate(os.path.getsize(shards[1]) - 3000)  # An interrupted copy.
    dataset = dict(tiny_dataset, train_pattern=str(records / 'train-*.tfrecord'))
    return dataset, shards, source_id


def _train(dataset, model_dir, *extra):
    return run_main(tiny_flags(dataset, str(model_dir), '--mode=train', '--num_epochs=1',
                               '--num_examples_per_epoch=16', '--log_every_n_steps=4',
                               *extra))


def test_truncated_shard_is_named_with_the_record_and_the_check(tiny_dataset, tmp_path):
    dataset, shards, _ = _faulty_copy(tiny_dataset, tmp_path, truncate=True)
    result = _train(dataset, tmp_path / 'run')
    assert_one_line_error(
        result, shards[1], 'truncated', 'at byte',
        "python -m dataset.verify_tfrecords '%s'" % dataset['train_pattern'],
        starts_with='main.py: error: TFRecord shard broken')


def test_undecodable_image_is_named_by_shard_record_and_source_id(tiny_dataset, tmp_path):
    dataset, shards, source_id = _faulty_copy(tiny_dataset, tmp_path, bad_image=True)
    result = _train(dataset, tmp_path / 'run')
    assert_one_line_error(result, '%s record %d' % (shards[0], BAD_SOURCE_INDEX),
                          'source_id %s' % source_id, 'does not decode', '--skip_bad_records')


def test_skip_bad_records_trains_past_them_and_reports_where(tiny_dataset, tmp_path):
    dataset, shards, _ = _faulty_copy(tiny_dataset, tmp_path, truncate=True, bad_image=True)
    model_dir = tmp_path / 'run'
    result = _train(dataset, model_dir, '--skip_bad_records')
    assert result.returncode == 0, result.stdout[-3000:]
    assert ('the training data had 1 bad record(s) in 1 shard(s): %s#%d'
            % (os.path.basename(shards[0]), BAD_SOURCE_INDEX)) in result.stdout
    assert 'shards cut short: %s' % os.path.basename(shards[1]) in result.stdout
    with open(model_dir / 'train_log.jsonl') as f:
        skipped = [r for r in map(json.loads, f) if r['event'] == 'skipped_records']
    assert skipped == [{'event': 'skipped_records', 'data': 'training', 'count': 1,
                        'records': {shards[0]: [BAD_SOURCE_INDEX]}, 'cut_short': [shards[1]]}]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith('-8')


@pytest.fixture
def small_disk(tmp_path):
    """A 95 MB tmpfs: room for the tiny model's first checkpoint (52 MB) and its events file
    (which holds the graph), not for a second checkpoint."""
    with tmpfs_disk(tmp_path / 'small_disk', '95m') as mount_point:
        yield mount_point


def test_full_disk_keeps_the_last_checkpoint_and_says_what_is_needed(tiny_dataset, small_disk):
    model_dir = small_disk / 'run'
    result = run_main(tiny_flags(tiny_dataset, str(model_dir), '--mode=train', '--num_epochs=1',
                                 '--cp_every_n_steps=1'))
    assert_one_line_error(
        result, 'MB free, about', 'MB needed', 'resumes from model.ckpt-0',
        starts_with='main.py: error: no space left on the device writing %s' % model_dir)
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest.endswith('model.ckpt-0')
    reader = tf.train.load_checkpoint(latest)  # Loads: the complete checkpoint is intact.
    assert reader.get_variable_to_shape_map()
    assert not glob.glob(str(model_dir / '*_temp*'))  # The cut one is gone, not left behind.


def _write_checkpoint_state(model_dir, name):
    with open(os.path.join(model_dir, 'checkpoint'), 'w') as f:
        f.write('model_checkpoint_path: "%s"\nall_model_checkpoint_paths: "%s"\n' % (name, name))


def test_evaluator_moves_on_when_its_checkpoint_was_rotated_out(tiny_dataset, tiny_trained_run,
                                                                tmp_path):
    """The training job beside it deleted the checkpoint the evaluator had picked: the
    evaluator says so, evaluates the next one and stops at --eval_timeout."""
    model_dir = str(tmp_path / 'run')
    shutil.copytree(tiny_trained_run, model_dir)  # Steps 0 and 2; this test changes them.
    _write_checkpoint_state(model_dir, 'model.ckpt-0')  # The evaluator picks step 0 first.
    command = [sys.executable, 'main.py'] + tiny_flags(tiny_dataset, model_dir) + [
        '--mode=eval', '--min_eval_interval=1', '--eval_timeout=20']
    lines = []
    with started(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')) as evaluator:

        def read():
            for line in evaluator.stdout:
                lines.append(line)
                if 'evaluating model.ckpt-0' in line:  # Training rotates it out, writes the next.
                    for path in glob.glob(os.path.join(model_dir, 'model.ckpt-0.*')):
                        os.remove(path)
                    _write_checkpoint_state(model_dir, 'model.ckpt-2')
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert evaluator.wait(timeout=600) == 0, ''.join(lines)[-3000:]
        reader.join(timeout=60)  # The evaluator has ended: its output ends with it.
    output = ''.join(lines)
    assert ('model.ckpt-0 was removed before evaluation (the training job keeps only '
            '--keep_checkpoint_max checkpoints); moving on') in output
    assert 'COCO evaluation of model.ckpt-2 (step 2' in output
    assert 'Traceback' not in output


def test_evaluation_beside_training_that_rotates_every_step(tiny_dataset, tmp_path):
    """A real training job keeping one checkpoint, written every step, and a real evaluator
    beside it: whatever it picks may vanish under it; it must end with the final step."""
    model_dir = str(tmp_path / 'run')
    common = tiny_flags(tiny_dataset, model_dir) + ['--num_epochs=1',
                                                    '--num_examples_per_epoch=60']
    trainer_log = str(tmp_path / 'trainer.log')  # A file, not a pipe nobody reads meanwhile.
    with open(trainer_log, 'w') as log, started(
            [sys.executable, 'main.py'] + common + [
                '--mode=train', '--cp_every_n_steps=1', '--keep_checkpoint_max=1'],
            stdout=log, stderr=subprocess.STDOUT) as trainer:
        time.sleep(2)
        evaluator = run_process(
            [sys.executable, 'main.py'] + common + [
                '--mode=eval', '--min_eval_interval=0', '--eval_timeout=600'], timeout=900)
        trainer.wait(timeout=900)
    trainer_output = open(trainer_log).read()
    assert trainer.returncode == 0, trainer_output[-3000:]
    assert evaluator.returncode == 0, evaluator.stdout[-3000:]
    assert 'Traceback' not in evaluator.stdout
    assert 'COCO evaluation of model.ckpt-30 (step 30' in evaluator.stdout
    assert 'evaluated the final step 30; stopping' in evaluator.stdout
