"""main.py end to end on a tiny real dataset: train, checkpoint, COCO eval, resume, warm start,
NaN stop and the user-error messages. Each run is a real subprocess, as a user runs it."""
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from cli_runs import TINY_HPARAMS, assert_one_line_error, run_main, started, tiny_flags

METRIC_KEYS = ['AP', 'AP50', 'AP75', 'APs', 'APm', 'APl',
               'ARmax1', 'ARmax10', 'ARmax100', 'ARs', 'ARm', 'ARl']


def _latest_step(model_dir):
    """The step the `checkpoint` file names (what a rerun resumes from), or None."""
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit('-', 1)[1]) if latest else None


def _records(model_dir, event):
    with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get('event') == event]


@pytest.fixture(scope='module')
def train_and_eval_run(tiny_dataset, tmp_path_factory):
    """One epoch (2 steps) of train_and_eval; shared by the tests that inspect its outputs.
    Not conftest's shared runs: tiny_trained_run does not evaluate, profiled_run profiles step
    2 (the plain train_and_eval output is what these tests check). With Grappler on, as users
    run it (the suite turns it off: conftest.py)."""
    model_dir = str(tmp_path_factory.mktemp('train_and_eval'))
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                 '--num_epochs=1'), env={'EFFICIENTDET_GRAPPLER': 'on'})
    assert result.returncode == 0, result.stdout[-5000:]
    return model_dir, result.stdout


def test_train_and_eval_writes_checkpoint_metrics_and_logs(train_and_eval_run):
    model_dir, output = train_and_eval_run
    assert tf.train.latest_checkpoint(model_dir).endswith('-2')
    for line in ['Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]',
                 'Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]']:
        assert line in output
    evals = _records(model_dir, 'eval')
    assert len(evals) == 1 and evals[0]['step'] == 2
    assert all(key in evals[0] for key in METRIC_KEYS)
    train = _records(model_dir, 'train')
    assert [r['step'] for r in train][-1] == 2
    for record in train:
        assert np.isfinite(record['loss']) and record['images_per_sec'] > 0
        assert {'cls_loss', 'box_loss', 'learning_rate', 'eta_sec'} <= set(record)
    best = json.load(open(os.path.join(model_dir, 'best', 'best_eval.json')))
    assert best['step'] == 2 and tf.train.latest_checkpoint(os.path.join(model_dir, 'best'))
    assert os.path.exists(os.path.join(model_dir, 'config.yaml'))
    assert os.path.getsize(os.path.join(model_dir, 'memory.csv')) > 0
    # TensorBoard: the loss terms written once, at the first step (every 100 steps after),
    # by engine/hooks.SummaryHook alone (not also by Estimator's own summary hook).
    loss_steps = [event.step for path in glob.glob(os.path.join(model_dir, 'events.out.*'))
                  for event in tf.compat.v1.train.summary_iterator(path)
                  for value in event.summary.value if value.tag == 'train/loss']
    assert loss_steps == [0], loss_steps


def test_resume_continues_the_step_counter(train_and_eval_run, tiny_dataset, tmp_path):
    model_dir, _ = train_and_eval_run
    resumed = str(tmp_path / 'resumed')
    os.makedirs(resumed)
    for name in os.listdir(model_dir):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path, 'rb') as src, open(os.path.join(resumed, name), 'wb') as dst:
                dst.write(src.read())
    copied = len(_records(resumed, 'train'))
    # By default no graph.pbtxt or .meta graph (~10 s of D0's start-up); the run resumes
    # without them, and --save_graph_def writes them as a plain Estimator does.
    assert not [name for name in os.listdir(model_dir)
                if name == 'graph.pbtxt' or name.endswith('.meta')]
    assert 'no graph.pbtxt or .meta graph files in model_dir' in train_and_eval_run[1]
    result = run_main(tiny_flags(tiny_dataset, resumed, '--mode=train', '--num_epochs=2',
                                 '--save_graph_def'))
    assert result.returncode == 0, result.stdout[-5000:]
    assert tf.train.latest_checkpoint(resumed).endswith('-4')
    assert os.path.isfile(os.path.join(resumed, 'graph.pbtxt'))
    assert os.path.isfile(os.path.join(resumed, 'model.ckpt-4.meta'))
    assert 'no graph.pbtxt' not in result.stdout
    assert 'resuming from %s/model.ckpt-2 (step 2)' % resumed in result.stdout
    new_steps = [r['step'] for r in _records(resumed, 'train')][copied:]
    assert new_steps and min(new_steps) > 2 and new_steps[-1] == 4, new_steps


def test_warm_start_with_another_class_count(train_and_eval_run, tiny_dataset, tmp_path):
    model_dir, _ = train_and_eval_run
    result = run_main(tiny_flags(
        tiny_dataset, str(tmp_path / 'finetune'), '--mode=train', '--num_epochs=1',
        '--ckpt=%s' % model_dir, hparams=TINY_HPARAMS + ',num_classes=5'))
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'class head re-initialised' in result.stdout


def test_warm_start_from_a_checkpoint_that_does_not_fit(train_and_eval_run, tiny_dataset,
                                                        tmp_path):
    model_dir, _ = train_and_eval_run
    result = run_main(tiny_flags(
        tiny_dataset, str(tmp_path / 'wrong'), '--mode=train', '--num_epochs=1',
        '--ckpt=%s' % model_dir, hparams=TINY_HPARAMS.replace('fpn_num_filters=16',
                                                              'fpn_num_filters=24')))
    assert result.returncode == 2
    assert 'does not fit this model' in result.stdout
    assert 'checkpoint has shape' in result.stdout


def test_model_dir_of_another_model_is_refused(train_and_eval_run, tiny_dataset):
    model_dir, _ = train_and_eval_run
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=3',
                                 hparams=TINY_HPARAMS.replace('fpn_cell_repeats=1',
                                                              'fpn_cell_repeats=2')))
    assert_one_line_error(result, 'holds a checkpoint of another model', 'fpn_cell_repeats 1 != 2')


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'nan')
    result = run_main(tiny_flags(
        tiny_dataset, model_dir, '--mode=train', '--num_epochs=3', '--cp_every_n_steps=1',
        hparams=TINY_HPARAMS + ',learning_rate=1e30,clip_gradients_norm=0.0,lr_warmup_init=1e30'))
    line = assert_one_line_error(result, 'at step', 'the last finite checkpoint model.ckpt-',
                                 'is kept', 'lower learning_rate, raise lr_warmup_epoch or '
                                 'set clip_gradients_norm')
    # Either the loss went non-finite (named by term) or a finite loss stepped the weights
    # to inf, caught before that checkpoint was written.
    assert 'non-finite: ' in line or 'the weights became non-finite' in line, line
    state = tf.train.get_checkpoint_state(model_dir)
    assert state is not None and state.all_model_checkpoint_paths
    for checkpoint in glob.glob(os.path.join(model_dir, 'model.ckpt-*.index')):
        reader = tf.train.load_checkpoint(checkpoint[:-len('.index')])
        for name in reader.get_variable_to_shape_map():  # Every checkpoint written, all finite.
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.all(np.isfinite(value)), (checkpoint, name)
    assert 'model.ckpt-%d ' % _latest_step(model_dir) in line


@pytest.mark.slow  # main.py up to its user error: TensorFlow's start-up.
@pytest.mark.parametrize('extra, message', [
    (['--training_file_pattern=/nonexistent/train-*.tfrecord'], 'no files match'),
    (['--train_batch_size=0'], 'must be a positive number of images per rank'),
    (['--hparams=image_size=100'], 'must be divisible by 2^min(max_level, 5)'),
    (['--model_name=efficientdet-d9'], "unknown model_name 'efficientdet-d9'"),
])
def test_user_errors_are_clear(tiny_dataset, tmp_path, extra, message):
    result = run_main(tiny_flags(tiny_dataset, str(tmp_path / 'err'), '--mode=train') + extra,
                      timeout=120)
    assert_one_line_error(result, message)


@pytest.mark.slow
def test_sigkill_mid_run_resumes_from_the_last_complete_checkpoint(tiny_dataset, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    model_dir = str(tmp_path / 'killed')
    flags = tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=1000',
                       '--cp_every_n_steps=1')
    with started([sys.executable, 'main.py'] + flags, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as process:
        # The Saver writes model.ckpt-N's files, then names N in the `checkpoint` file: what
        # a rerun resumes from. Waiting on that file, not on the .index (a kill between the
        # two leaves N-1 the latest, as it should).
        deadline = time.time() + 600
        while time.time() < deadline and (_latest_step(model_dir) or 0) < 3:
            time.sleep(0.5)
        process.send_signal(signal.SIGKILL)
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest is not None
    killed_at = _latest_step(model_dir)
    assert killed_at >= 3
    # Same command, shorter schedule: finishes right after the step it resumed from.
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train',
                                 '--num_epochs=%d' % (killed_at // 2 + 1), '--cp_every_n_steps=1'))
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'resuming from %s' % latest in result.stdout
    final = _latest_step(model_dir)
    assert final == 2 * (killed_at // 2 + 1)
