"""main.py --steps_file (training/steps_file.py, core/run_end.py): a run's end moved while it
trains. In-process: the learning rate and moving average read from its variables equal a run
planned that short from the start. A real main.py: the file written mid-run moves the end
later, then sooner: the run ends there, its cosine at zero, its evaluations (past the planned
end too) and checkpoint at the new last step."""
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.core import run_end
from efficientdet_hpu.engine import train_log
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.training import steps_file
from cli_runs import TINY_HPARAMS, python_env, started, tiny_flags

tf1 = tf.compat.v1


def test_the_record_is_read_only_whole_and_valid(tmp_path):
    path = str(tmp_path / 'steps.json')
    assert run_end.read(path) is None and run_end.target_steps(path, 20) == 20
    run_end.write(path, 8, 3, 0.99)
    assert run_end.read(path) == {'total_steps': 8, 'warmup_steps': 3,
                                  'moving_average_decay': 0.99}
    assert run_end.target_steps(path, 20) == 8 and run_end.target_steps(path, 6) == 8
    run_end.write(path, 8)
    assert run_end.read(path) == {'total_steps': 8, 'warmup_steps': None,
                                  'moving_average_decay': None}
    for text in ('{"total_steps": 8', '{"total_steps": 0}', '{"total_steps": 8, '
                 '"moving_average_decay": 1.5}', '{"total_steps": 8, "warmup_steps": -1}',
                 '[8]'):
        with open(path, 'w') as stream:
            stream.write(text)
        assert run_end.read(path) is None, text


def _schedule_and_ema(planned, moved=None, steps=12):
    """Learning rates at steps 0..steps-1 and the shadow of one variable after those steps'
    updates (the variable set to the step each time), planned as `planned` (total steps,
    warm-up steps, EMA decay), with --steps_file's variables moved to `moved` before the
    first step when given."""
    total, warmup, decay = planned
    with tf.Graph().as_default():
        step = tf1.placeholder(tf.int64, [])
        variables = None
        if moved is not None:
            variables = steps_file.schedule_variables(
                dict(zip(KEYS, planned)))
            total, warmup, decay = (variables[name] for name in KEYS)
        rate = det_model_fn.learning_rate_schedule(
            step, base_rate=0.1, warmup_init=0.01, warmup_steps=warmup, total_steps=total,
            cosine_from_warmup_end=True)
        variable = tf1.get_variable('w', initializer=0.0)
        shadows = checkpoints.ema_shadows([variable])
        value = tf1.placeholder(tf.float32, [])
        update = checkpoints.ema_update([variable], shadows, decay, step)
        with tf1.Session() as session:
            session.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            for name, new in zip(KEYS, moved or ()):
                session.run(variables[name].assign(float(new)))
            rates = []
            for s in range(steps):
                rates.append(session.run(rate, {step: s}))
                session.run(variable.assign(value), {value: float(s)})
                session.run(update, {step: s})
            return rates, session.run(shadows[0])


KEYS = (run_end.TOTAL_STEPS, run_end.WARMUP_STEPS, run_end.EMA_DECAY)


def test_variables_moved_to_a_shorter_run_give_its_schedule_and_average():
    planned = _schedule_and_ema((8, 2, 0.5))
    moved = _schedule_and_ema((20, 4, 0.9), moved=(8, 2, 0.5))
    np.testing.assert_allclose(moved[0], planned[0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(moved[1], planned[1], rtol=1e-6)
    unmoved = _schedule_and_ema((20, 4, 0.9))
    assert not np.allclose(unmoved[0], planned[0])  # The comparison can fail.
    assert not np.allclose(unmoved[1], planned[1])
    assert planned[0][8] == 0.0 and planned[0][0] == pytest.approx(0.01)


def _records(model_dir):
    return [r for r in train_log.read_json_log(model_dir) if r.get('event') == 'train']


def test_a_file_written_mid_run_moves_the_end_later_then_sooner(tiny_dataset, tmp_path):
    """20 steps planned (an evaluation every 2). Once step 2 is logged the file asks for 30:
    the run trains past step 20, evaluating every 2 steps on; once a step past 20 is logged it
    asks for a few steps on: the run ends there with its checkpoint and evaluation, the
    learning rate near zero there, and says each move."""
    model_dir, path = str(tmp_path / 'model'), str(tmp_path / 'steps.json')
    hparams = TINY_HPARAMS + ',cosine_from_warmup_end=true,lr_warmup_epoch=1.0'
    command = [sys.executable, 'main.py'] + tiny_flags(
        tiny_dataset, model_dir, '--mode=train_and_eval', '--num_epochs=10',
        '--steps_file=' + path, hparams=hparams)
    log_path, asked = str(tmp_path / 'main.log'), []
    with open(log_path, 'w') as log, started(command, env=python_env(), stdout=log,
                                             stderr=subprocess.STDOUT) as process:
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            reached = max([r['step'] for r in _records(model_dir)] or [0])
            if not asked and reached >= 2:
                run_end.write(path, 30, 2, 0.9)
                asked.append(30)
            elif len(asked) == 1 and reached > 20:
                asked.append(reached + 4 + reached % 2)  # An even step: an epoch's end.
                run_end.write(path, asked[-1], 2, 0.9)
                break
            time.sleep(0.2)
        status = process.wait(timeout=max(1, deadline - time.time()))
    output = open(log_path).read()
    assert status == 0 and len(asked) == 2, output[-3000:]
    end = asked[-1]
    records = _records(model_dir)
    assert records[-1]['step'] == end, output[-3000:]
    assert 'the run now ends at step 30 (was 20)' in output
    assert 'the run now ends at step %d (was 30)' % end in output
    assert os.path.basename(checkpoints.latest_checkpoint(model_dir)) == 'model.ckpt-%d' % end
    evaluated = [r['step'] for r in train_log.read_json_log(model_dir) if r.get('event') == 'eval']
    assert evaluated == list(range(2, end + 1, 2)), evaluated  # Past 20, and none after the end.
    # The rate logged at the end is the schedule's at the step before: cosine from the warm-up's
    # end (step 2) to the end.
    peak = max(r['learning_rate'] for r in records)
    assert records[-1]['learning_rate'] == pytest.approx(
        peak * 0.5 * (1 + math.cos(math.pi * (end - 3) / (end - 2))), rel=0.02)
    assert records[-1]['total_steps'] == end


def test_an_end_moved_later_during_the_last_evaluation_trains_on(tiny_dataset, tmp_path):
    """6 steps planned, an evaluation every 2. The file asks for 10 once the checkpoint of step
    6 is written, while the run evaluates its last step: the file is read again after that
    evaluation, so the run trains on to 10 in the same process, evaluating at 8 and 10."""
    model_dir, path = str(tmp_path / 'model'), str(tmp_path / 'steps.json')
    command = [sys.executable, 'main.py'] + tiny_flags(
        tiny_dataset, model_dir, '--mode=train_and_eval', '--num_epochs=3',
        '--steps_file=' + path)
    log_path, last = str(tmp_path / 'main.log'), os.path.join(model_dir, 'model.ckpt-6.index')
    with open(log_path, 'w') as log, started(command, env=python_env(), stdout=log,
                                             stderr=subprocess.STDOUT) as process:
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None and not os.path.exists(last):
            time.sleep(0.02)
        written = process.poll() is None
        if written:
            run_end.write(path, 10, None, None)
        status = process.wait(timeout=max(1, deadline - time.time()))
    output = open(log_path).read()
    assert status == 0 and written, output[-3000:]
    assert 'the run now ends at step 10 (was 6)' in output, output[-3000:]
    evaluated = [r['step'] for r in train_log.read_json_log(model_dir) if r.get('event') == 'eval']
    assert evaluated == [2, 4, 6, 8, 10], evaluated
    assert os.path.basename(checkpoints.latest_checkpoint(model_dir)) == 'model.ckpt-10'
    assert output.count('train_and_eval: evaluations at') == 1  # One train() call.
