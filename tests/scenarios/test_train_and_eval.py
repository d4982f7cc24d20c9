"""train_and_eval evaluates inside the training session (engine/training_eval.py): every
evaluation's metrics equal those of a separate `--mode=eval` of the same checkpoint, in one
process and under a real `mpirun -np 2`; the run's wall time line and record."""
import glob
import json
import os
import shutil

import pytest

from cli_runs import run_main, run_python, tiny_flags

pytestmark = pytest.mark.slow  # Real training and evaluation processes.

IN_SESSION_LINE = 'train_and_eval: evaluations at steps %s, in the training session'


def _launch(flags, timeout=900):
    return run_python(['demo_efficientdet.py', '--use_horovod', '2'] + flags, timeout=timeout)


def _metrics(model_dir, step):
    with open(os.path.join(model_dir, 'eval', 'metrics-%d.json' % step)) as f:
        return json.load(f)['metrics']


def _records(model_dir, event):
    with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
        return [record for record in map(json.loads, f) if record['event'] == event]


def _evaluate_alone(model_dir, step, tmp_path, evaluate):
    """Metrics of `--mode=eval` (through `evaluate(model_dir) -> CompletedProcess`) of
    model_dir's checkpoint of `step`, in a copy whose checkpoint list names only it and
    that holds no evaluation."""
    copy = str(tmp_path / ('alone-%d' % step))
    shutil.copytree(model_dir, copy, ignore=shutil.ignore_patterns('eval', 'best'))
    with open(os.path.join(copy, 'checkpoint'), 'w') as f:
        f.write('model_checkpoint_path: "model.ckpt-%d"\n'
                'all_model_checkpoint_paths: "model.ckpt-%d"\n' % (step, step))
    result = evaluate(copy)
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'COCO evaluation of model.ckpt-%d (step %d,' % (step, step) in result.stdout
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(copy, 'eval',
                                                                       'metrics-*.json'))) == [
        'metrics-%d.json' % step]
    return _metrics(copy, step)


@pytest.fixture(scope='module')
def one_process_run(tiny_dataset, tmp_path_factory):
    """3 epochs of 2 steps of train_and_eval in one process: evaluations at 2, 4 and 6."""
    model_dir = str(tmp_path_factory.mktemp('in_session'))
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                 '--num_epochs=3'))
    assert result.returncode == 0, result.stdout[-5000:]
    return model_dir, result.stdout


def test_each_evaluation_equals_a_separate_eval_of_its_checkpoint(one_process_run,
                                                                  tiny_dataset, tmp_path):
    model_dir, output = one_process_run
    assert IN_SESSION_LINE % '2, 4 and 6' in output
    assert [r['step'] for r in _records(model_dir, 'eval')] == [2, 4, 6]
    for step in (2, 4, 6):
        alone = _evaluate_alone(model_dir, step, tmp_path, lambda copy: run_main(tiny_flags(
            tiny_dataset, copy, '--mode=eval', '--num_epochs=3', '--eval_timeout=1',
            '--min_eval_interval=0')))
        assert alone == _metrics(model_dir, step), step
        (record,) = [r for r in _records(model_dir, 'eval') if r['step'] == step]
        assert {key: record[key] for key in alone} == alone


def test_the_run_says_where_its_wall_time_went(one_process_run):
    model_dir, output = one_process_run
    (record,) = _records(model_dir, 'wall_time')
    assert (record['mode'], record['step'], record['evaluations'], record['training_steps']) == (
        'train_and_eval', 6, 3, 6)
    assert record['checkpoints'] == 4  # Steps 0, 2, 4 and 6.
    parts = sum(record[key + '_sec'] for key in ('startup', 'steps', 'evaluations',
                                                 'checkpoints', 'other'))
    assert parts == pytest.approx(record['wall_sec'], rel=1e-9)
    (line,) = [l for l in output.splitlines() if l.startswith('wall time ')]
    assert line.startswith('wall time %.1f s: start-up %.1f s (' % (record['wall_sec'],
                                                                    record['startup_sec']))


@pytest.fixture(scope='module')
def two_rank_run(tiny_dataset, tmp_path_factory):
    """2 epochs of train_and_eval under mpirun -np 2 (2 per rank, 8 images an epoch: 2
    steps): evaluations at 2 and 4, every rank predicting its shard."""
    model_dir = str(tmp_path_factory.mktemp('in_session_hvd'))
    result = _launch(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                '--num_epochs=2', '--num_examples_per_epoch=8'))
    assert result.returncode == 0, result.stdout[-6000:]
    return model_dir, result.stdout


@pytest.mark.timeout(1200)  # Two mpirun jobs.
def test_under_mpirun_each_evaluation_equals_a_separate_eval(two_rank_run, tiny_dataset,
                                                             tmp_path):
    model_dir, output = two_rank_run
    assert IN_SESSION_LINE % '2 and 4' in output
    assert '[rank 1/2] evaluating model.ckpt-4 (step 4)' in output  # Rank 1 predicts too.
    assert [r['step'] for r in _records(model_dir, 'eval')] == [2, 4]
    assert len([l for l in output.splitlines() if 'wall time ' in l]) == 1  # Rank 0's.
    # The second evaluation, which follows one in the same session (the first is compared in
    # one process above): a separate mpirun job each costs two TensorFlow start-ups.
    alone = _evaluate_alone(model_dir, 4, tmp_path, lambda copy: _launch(tiny_flags(
        tiny_dataset, copy, '--mode=eval', '--num_epochs=2', '--num_examples_per_epoch=8',
        '--eval_timeout=1', '--min_eval_interval=0')))
    assert alone == _metrics(model_dir, 4)
