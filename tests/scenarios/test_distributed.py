"""Real `mpirun -np 2` runs through the launcher: Horovod training and distributed evaluation."""
import glob
import json
import os
import re
import shutil

import pytest
import tensorflow as tf

from cli_runs import run_main, run_python, tiny_flags

pytestmark = pytest.mark.slow  # Real mpirun -np 2 training and evaluation.

CHECKSUM_RE = re.compile(r'final weights at step (\d+): checksum (\S+)')


def _launch(flags, timeout=900):
    return run_python(['demo_efficientdet.py', '--use_horovod', '2'] + flags, timeout=timeout)


@pytest.fixture(name='distributed_run')
def distributed_run_fixture(two_rank_run):
    """(model_dir, output) of conftest's two_rank_run: 8 steps of a global batch of 4."""
    return two_rank_run['model_dir'], two_rank_run['output']


def test_both_ranks_finish_with_identical_weights(distributed_run):
    _, output = distributed_run
    found = CHECKSUM_RE.findall(output)
    assert len(found) == 2, output[-4000:]
    assert found[0] == found[1]
    assert found[0][0] == '8'


def test_global_step_follows_the_global_batch_and_only_rank0_writes(distributed_run):
    model_dir, output = distributed_run
    assert tf.train.latest_checkpoint(model_dir).endswith('-8')
    with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
        records = [json.loads(line) for line in f]
    steps = [r['step'] for r in records if r['event'] == 'train']
    assert steps == sorted(set(steps)) and steps[-1] == 8  # One writer: no step twice.
    assert records[-2]['images_per_sec'] > 0
    # Rank 0 alone says where the wall time went, last.
    assert [(r['event'], r['step']) for r in records if r['event'] != 'train'] == [
        ('wall_time', 8)]
    assert len(re.findall(r'<stdout>:wall time [\d.]+ s: start-up ', output)) == 1
    # Rank 1 logs with its rank tag (on stderr, merged by mpirun's --tag-output).
    assert re.search(r'\[1,1\]<std(out|err)>:.*\[rank 1/2\]', output), output[-3000:]
    # The first line says what a carried-over command means: 2 per rank is 4 a step.
    assert re.search(r'on CPU x2: batch 2 per rank, global 4; learning rate [\d.e-]+ '
                     r'\([\d.e-]+ per 64 images\); 8 steps \(2 per epoch\); batch norm '
                     r'synchronised across ranks', output), output[-3000:]


def test_distributed_eval_equals_single_process(distributed_run, tiny_dataset, tmp_path):
    model_dir, _ = distributed_run
    single, multi = str(tmp_path / 'single'), str(tmp_path / 'multi')
    for target in (single, multi):
        shutil.copytree(model_dir, target)
        for path in glob.glob(os.path.join(target, 'eval*')) + glob.glob(os.path.join(target, 'best')):
            shutil.rmtree(path, ignore_errors=True)
    common = ['--mode=eval', '--num_epochs=4', '--num_examples_per_epoch=8',
              '--eval_timeout=1', '--min_eval_interval=0']
    # The same global batch (4): 4 images in one process, 2 per rank on two.
    one = run_main(tiny_flags(tiny_dataset, single, *common, '--train_batch_size=4'))
    assert one.returncode == 0, one.stdout[-5000:]
    two = _launch(tiny_flags(tiny_dataset, multi, *common))
    assert two.returncode == 0, two.stdout[-5000:]
    metrics = [json.load(open(os.path.join(d, 'eval', 'metrics-8.json')))['metrics']
               for d in (single, multi)]
    assert metrics[0] == metrics[1]
    # Rank 0 shows its progress as its share (one validation file: every 2nd record of 8);
    # rank 1 shows none. mpirun's pipe: plain lines.
    shown = [line for line in two.stdout.splitlines() if 'evaluating model.ckpt-8: ' in line]
    assert shown and all(line.startswith('[1,0]<') for line in shown), shown
    assert re.search(r"evaluating model\.ckpt-8: 4/4 images \(100%; rank 0's share of 8\) in "
                     r'0:\d\d:\d\d( \(start-up 0:\d\d:\d\d\))?, [\d.]+ images/s$', shown[-1])
    assert 'gathering the detections of the 2 ranks' in two.stdout
    assert re.search(r'evaluating model\.ckpt-8: 8/8 images \(100%\) in ', one.stdout)
    assert any(v not in (0, -1, None) for v in metrics[0].values()), metrics[0]
