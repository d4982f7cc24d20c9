"""train_and_eval evaluates inside the training session (engine/training_eval.py): every
evaluation's metrics equal those of a separate `--mode=eval` of the same checkpoint, in one
process (under a real mpirun, ranks on two boxes: test_multibox.py); the run's wall time line
and record."""
import glob
import json
import os
import shutil

import pytest

from cli_runs import run_main, tiny_flags

pytestmark = pytest.mark.slow  # Real training and evaluation processes.

IN_SESSION_LINE = 'train_and_eval: evaluations at steps %s, in the training session'


def metrics(model_dir, step):
    with open(os.path.join(model_dir, 'eval', 'metrics-%d.json' % step)) as f:
        return json.load(f)['metrics']


def _records(model_dir, event):
    with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
        return [record for record in map(json.loads, f) if record['event'] == event]


def evaluate_alone(model_dir, step, tmp_path, evaluate):
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
    return metrics(copy, step)


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
        alone = evaluate_alone(model_dir, step, tmp_path, lambda copy: run_main(tiny_flags(
            tiny_dataset, copy, '--mode=eval', '--num_epochs=3', '--eval_timeout=1',
            '--min_eval_interval=0')))
        assert alone == metrics(model_dir, step), step
        (record,) = [r for r in _records(model_dir, 'eval') if r['step'] == step]
        assert {key: record[key] for key in alone} == alone


def test_an_evaluation_without_hparams_takes_the_model_from_config_yaml(one_process_run,
                                                                        tiny_dataset, tmp_path):
    """`main.py --mode=eval` with the data flags only (the README's evaluation, on a model
    trained with other hparams, as a fine-tune's Lite0): the model_dir's config.yaml decides
    the model, and the metrics are the training's own evaluation's. The training's flags.json
    and config.yaml are left as they were (an evaluation wrote its own over them: flags.json
    lost the training's TFRecords, where int8 export finds its calibration photos)."""
    model_dir, _ = one_process_run
    alone = evaluate_alone(model_dir, 6, tmp_path, lambda copy: run_main([
        '--mode=eval', '--model_dir=%s' % copy, '--eval_batch_size=2',
        '--validation_file_pattern=%s' % tiny_dataset['val_pattern'],
        '--val_json_file=%s' % tiny_dataset['val_json'], '--eval_timeout=1',
        '--min_eval_interval=0']))
    assert alone == metrics(model_dir, 6)
    for name in ('flags.json', 'config.yaml'):
        with open(os.path.join(model_dir, name)) as trained, \
                open(str(tmp_path / 'alone-6' / name)) as evaluated:
            assert evaluated.read() == trained.read(), name


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
