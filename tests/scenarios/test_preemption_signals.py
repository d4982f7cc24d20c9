"""Preemption with real signals: SIGTERM to a one-process run and to one rank of a real
`mpirun -np 2` run, and SIGHUP to that run's launcher, stop the job at one step agreed by the
ranks, with the checkpoint of that step written and one line saying so; the rerun continues
from it (under --deterministic to the same weights as an uninterrupted run); a second signal
ends at once."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from cli_runs import (TWO_RANK_EPOCHS, python_env, run_main, run_process, started, tiny_flags,
                      two_rank_flags)
from test_distributed_resume import RANK_CHECKSUM_RE, _kill_tree, _rank_pids, _wait_until
from test_signals import signal_during_training

pytestmark = pytest.mark.slow  # Real training processes, signalled.

STEP_RE = re.compile(r'step (\d+)/\d+ loss')
STOP_RE = re.compile(r'main\.py: stopped by SIGTERM at step (\d+); checkpoint (model\.ckpt-\d+) '
                     r'written; rerun the same command to continue')
SIGTERM_STATUS = 128 + signal.SIGTERM


@contextlib.contextmanager
def _started(command, log_path):
    """`python command...` in a session of its own (cli_runs.started: killed with its group on
    leaving the block), its output to log_path."""
    with open(log_path, 'w') as log, started([sys.executable] + command, env=python_env(),
                                             stdout=log, stderr=subprocess.STDOUT) as process:
        yield process


def _steps_logged(log_path):
    with open(log_path) as f:
        return [int(step) for step in STEP_RE.findall(f.read())]


def _latest_step(model_dir):
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit('-', 1)[1]) if latest else None


def test_sigterm_to_a_one_process_run_keeps_the_step_and_the_rerun_goes_on(tiny_dataset,
                                                                           tmp_path):
    model_dir = str(tmp_path / 'model')
    # 2 steps per epoch; checkpoints every 1000 steps: only the signal's checkpoint is new.
    flags = tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=1000')
    log_path = str(tmp_path / 'run.log')
    with _started(['main.py'] + flags, log_path) as process:
        assert _wait_until(lambda: max(_steps_logged(log_path) or [0]) >= 3
                           or process.poll() is not None, 600), open(log_path).read()[-3000:]
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=120)
    output = open(log_path).read()
    assert returncode == SIGTERM_STATUS, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    (stopped,) = STOP_RE.findall(output)
    step, name = int(stopped[0]), stopped[1]
    assert step >= 3 and name == 'model.ckpt-%d' % step, stopped
    assert max(_steps_logged(log_path)) == step  # The step reached is the one kept.
    assert _latest_step(model_dir) == step
    assert not os.path.exists(os.path.join(model_dir, '.lock'))  # A clean end frees model_dir.
    # Where the time went, as at a whole run's end, before the stop's line.
    wall = re.search(r'^wall time [0-9.]+ s: start-up .*; process CPU', output, re.M)
    assert wall and wall.start() < output.index('main.py: stopped by'), output[-3000:]

    # The same command continues (a shorter schedule, 3 or 4 steps more: the first step of a
    # run is not logged).
    epochs = step // 2 + 2
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train',
                                 '--num_epochs=%d' % epochs))
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'resuming from %s (step %d)' % (os.path.join(model_dir, name), step) in result.stdout
    assert min(_steps(result.stdout)) > step and _latest_step(model_dir) == 2 * epochs

    # Twice the batch per rank: half the steps per epoch; the checkpoint is past the end.
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train',
                                 '--num_epochs=%d' % epochs, '--train_batch_size=4'))
    assert result.returncode == 0, result.stdout[-3000:]
    assert ('model.ckpt-%d is already past the last step (%d of %d): nothing to train; raise '
            '--num_epochs to go on' % (2 * epochs, 2 * epochs, epochs)) in result.stdout
    assert ('with another schedule than its run: global batch 2 -> 4, learning rate '
            in result.stdout), result.stdout[-3000:]
    assert ('steps per epoch 2 -> 1, total steps %d -> %d (ranks x batch per rank 1 x 2 -> '
            '1 x 4)' % (2 * epochs, epochs)) in result.stdout
    assert _latest_step(model_dir) == 2 * epochs


def _steps(output):
    return [int(step) for step in STEP_RE.findall(output)]


def _final_checksums(output):
    return {int(rank): (int(step), checksum)
            for rank, step, checksum in RANK_CHECKSUM_RE.findall(output)}


@pytest.mark.timeout(2400)  # Three mpirun trainings: two signalled, the last whole.
def test_sigterm_to_one_rank_then_sighup_to_the_launcher_stop_both_ranks_at_one_step(
        tiny_dataset, two_rank_run, tmp_path):
    """SIGTERM to rank 1 of a real `mpirun -np 2` run stops both ranks at one step. The rerun
    resumes there and is stopped by SIGHUP to the launcher (as a closed terminal sends it):
    both ranks at the next step, every process of the run ended, the launcher's one line, exit
    129. The second rerun ends with the weights of conftest's two_rank_run, the same command
    run whole (one run signalled twice, not two: each mpirun start-up costs minutes here)."""
    total = 2 * TWO_RANK_EPOCHS  # 2 steps an epoch.
    launcher = ['demo_efficientdet.py', '--use_horovod', '2']
    log_path = str(tmp_path / 'signalled.log')
    model_dir = str(tmp_path / 'model')
    with _started(launcher + two_rank_flags(tiny_dataset, model_dir), log_path) as process:
        pids = []
        try:
            assert _wait_until(lambda: max(_steps_logged(log_path) or [0]) >= 2
                               or process.poll() is not None, 900), open(log_path).read()[-4000:]
            ranks = _rank_pids(process.pid)
            pids = list(ranks.values())
            assert process.poll() is None and sorted(ranks) == [0, 1], \
                open(log_path).read()[-4000:]
            os.kill(ranks[1], signal.SIGTERM)  # One rank only: the other hears it from the ranks.
            returncode = process.wait(timeout=180)
            assert _wait_until(lambda: not any(os.path.exists('/proc/%d' % p) for p in pids), 10)
        finally:
            _kill_tree(process, pids)
    output = open(log_path).read()
    assert returncode == SIGTERM_STATUS, output[-4000:]
    (stopped,) = STOP_RE.findall(output)
    step = int(stopped[0])
    assert 2 <= step < total - 1 and _latest_step(model_dir) == step, output[-4000:]
    final = _final_checksums(output)  # Both ranks ended at the stop step, equal weights.
    assert sorted(final) == [0, 1] and final[0] == final[1] and final[0][0] == step, final

    # SIGHUP once a rank has said it resumes: the first step's stop signal is agreed after it.
    command = [sys.executable] + launcher + two_rank_flags(tiny_dataset, model_dir)
    status, output, pids, _ = signal_during_training(
        command, str(tmp_path / 'sighup.log'), lambda text: 'resuming from' in text,
        [signal.SIGHUP], env={'TF_CPP_MIN_LOG_LEVEL': '2'})
    assert status == 128 + signal.SIGHUP, output[-4000:]
    assert len(pids) >= 4, pids  # The launcher, mpirun and the two ranks.
    assert 'resuming from %s (step %d)' % (os.path.join(model_dir, 'model.ckpt-%d' % step),
                                            step) in output, output[-4000:]
    hup = _latest_step(model_dir)
    assert step < hup < total, (step, hup, output[-4000:])
    assert 'main.py: stopped by SIGHUP at step %d; checkpoint model.ckpt-%d written' % (
        hup, hup) in output, output[-4000:]
    line = ('demo_efficientdet.py: stopped by SIGHUP; checkpoint model.ckpt-%d kept in %s; '
            'rerun the same command to continue' % (hup, model_dir))
    assert output.count('demo_efficientdet.py: stopped by') == 1 and line in output, \
        output[-4000:]

    rerun = run_process(command, timeout=900, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert 'resuming from' in rerun.stdout and min(_steps(rerun.stdout)) > hup
    resumed = _final_checksums(rerun.stdout)
    uninterrupted = _final_checksums(two_rank_run['output'])
    assert resumed[0] == resumed[1] == uninterrupted[0] == uninterrupted[1], (
        resumed, uninterrupted)
    assert resumed[0][0] == total


def test_a_second_signal_ends_the_process_at_once(tmp_path):
    """The handler of preemption.install() only records the first signal (SIGUSR2, what the
    launcher passes through mpirun for SIGTERM, recorded as SIGTERM); the second one has the
    default action (the process dies of it)."""
    code = ('import os, signal, sys, time\n'
            'from efficientdet_hpu.engine import preemption\n'
            'preemption.install()\n'
            'os.kill(os.getpid(), signal.SIGUSR2)\n'
            'time.sleep(0.5)\n'
            'print("recorded", preemption.received(), flush=True)\n'
            'os.kill(os.getpid(), signal.SIGINT)\n'
            'time.sleep(5)\n'
            'print("still alive", flush=True)\n')
    result = run_process([sys.executable, '-c', code], timeout=120,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    assert 'recorded %d' % signal.SIGTERM in result.stdout, result.stdout
    assert 'still alive' not in result.stdout
    assert result.returncode == -signal.SIGINT, result.stdout


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_evaluator_waits_is_one_line(tiny_dataset, tmp_path, signum):
    """--mode=eval on a model_dir no training has written yet says that it waits and for how
    long; Ctrl-C or SIGTERM there ends it with one line, 128+N, no traceback (Ctrl-C gave
    KeyboardInterrupt's traceback, SIGTERM a silent kill)."""
    model_dir = str(tmp_path / 'model')
    log_path = str(tmp_path / 'eval.log')
    waiting = 'waiting for a first checkpoint in %s (until one comes: --eval_timeout=N' % model_dir
    with _started(['main.py'] + tiny_flags(tiny_dataset, model_dir, '--mode=eval'),
                  log_path) as process:
        assert _wait_until(lambda: waiting in open(log_path).read()
                           or process.poll() is not None, 300), open(log_path).read()[-3000:]
        process.send_signal(signum)
        returncode = process.wait(timeout=60)
    output = open(log_path).read()
    assert returncode == 128 + signum, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    assert output.rstrip().endswith(
        'main.py: stopped by %s during --mode=eval after 0 evaluations; rerun the same command '
        'to go on' % signal.Signals(signum).name), output[-3000:]
