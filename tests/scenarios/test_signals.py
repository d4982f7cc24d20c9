"""A stop signal to a command that starts processes, sent during training, as `kill`, `timeout`,
Kubernetes or a closed terminal send it: every process of the run ends within the deadline,
main.py keeps the checkpoint of the step it is at, the command says so in one line and exits
128+N, and the same command run again goes on from that checkpoint. One signal per command:
SIGTERM to the fine-tune, SIGINT to bench (SIGHUP to the launcher's real `mpirun -np 2` run:
test_preemption_signals.py, which signals that run twice); and a second signal once (the
fine-tune's rerun), which ends everything at once."""
import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from cli_runs import TINY_HPARAMS, python_env, run_process, signalled, started
from efficientdet_hpu.core import processes
import review_cases
from test_finetune import make_coco

pytestmark = pytest.mark.slow  # Real fine-tune, mpirun and bench runs, signalled.

STEP_RE = re.compile(r'step (\d+)/\d+ loss')
RESUMED_RE = re.compile(r'resuming from \S*model\.ckpt-(\d+) \(step (\d+)\)')
STOP_SECONDS = 180  # From the signal to the end of every process of the run (a step, a save).


def _tree(root):
    """root and every process below it (/proc), whatever session or group they are in."""
    table = processes.process_table()
    found, todo = [root], [root]
    while todo:
        below = [pid for pid, (parent, _, _) in table.items() if parent == todo[-1]]
        todo.pop()
        found += below
        todo += below
    return found


def _wait_until(predicate, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError('waited %d s for %s' % (seconds, what))


def _read(path):
    try:
        with open(path, errors='replace') as stream:
            return stream.read()
    except OSError:
        return ''


def _steps(text):
    return [int(step) for step in STEP_RE.findall(text)]


def _latest_step(model_dir):
    found = re.search(r'model_checkpoint_path: "[^"]*?(\d+)"',
                      _read(os.path.join(model_dir, 'checkpoint')))
    return int(found.group(1)) if found else None


def signal_during_training(command, log_path, ready, signals, gap=0.0, env=None):
    """Starts `command` (its output to log_path), waits until ready(output), records every
    process of the run, sends `signals` to the command (gap seconds apart); returns (exit
    status, output, the pids recorded, seconds from the first signal to the command's end)."""
    with open(log_path, 'w') as log, started(command, env=python_env(env), stdout=log,
                                             stderr=subprocess.STDOUT) as process:
        _wait_until(lambda: ready(_read(log_path)) or process.poll() is not None, 900,
                    'training to start')
        assert process.poll() is None, _read(log_path)[-4000:]
        pids = _tree(process.pid)
        status, seconds, left = signalled(process, signals, gap, STOP_SECONDS, pids)
        assert not left, left
    return status, _read(log_path), pids, seconds


@pytest.mark.timeout(1500)
def test_sigterm_to_the_finetune_keeps_the_step_and_the_rerun_goes_on(tmp_path):
    """2000 planned steps of 1 epoch (no evaluation comes before the signal); SIGTERM once
    main.py has logged step 3. The rerun resumes from the checkpoint kept; it is then stopped
    by two SIGTERMs a second apart: the second ends it at once."""
    data, out = make_coco(str(tmp_path / 'data')), tmp_path / 'out'
    schedule = ('num_examples_per_epoch=16000,num_epochs=1,log_every_n_steps=1,'
                'cp_every_n_steps=1000,early_stop_patience=0')
    command = [sys.executable, 'finetune.py', '--data=%s' % data, '--output_dir=%s' % out,
               '--steps=2000', '--hparams=%s,%s' % (TINY_HPARAMS, schedule)]
    status, output, pids, _ = signal_during_training(
        command, str(tmp_path / 'first.log'), lambda text: max(_steps(text) or [0]) >= 3,
        [signal.SIGTERM])
    assert status == 143, output[-4000:]
    step = _latest_step(str(out / 'model'))
    assert step is not None and step >= 3, output[-4000:]
    assert max(_steps(output)) == step  # The step main.py reached is the one kept.
    line = ('finetune: stopped by SIGTERM during training at step %d; checkpoint '
            'model/model.ckpt-%d kept; rerun the same command to continue' % (step, step))
    assert output.count('finetune: stopped by') == 1 and line in output.splitlines(), \
        output[-4000:]
    assert 'main.py: stopped by SIGTERM at step %d' % step in output
    assert len(pids) >= 2 and 'Traceback' not in output
    assert not os.path.exists(out / 'training.json')  # The rerun trains on.

    status, output, pids, seconds = signal_during_training(
        command, str(tmp_path / 'rerun.log'), lambda text: RESUMED_RE.search(text),
        [signal.SIGTERM, signal.SIGTERM], gap=processes.SAME_STOP_SECONDS + 0.5)
    assert [int(n) for n in RESUMED_RE.search(output).groups()] == [step, step], output[-4000:]
    assert status == 143 and seconds < 30, (seconds, output[-4000:])
    assert ('finetune: stopped by SIGTERM during training at step ' in output
            and '(a second stop signal: its processes were killed at once)' in output), \
        output[-4000:]


@pytest.mark.timeout(1500)
def test_sigterm_to_the_review_keeps_the_folds_step_and_the_rerun_resumes_it(tmp_path):
    """review.py trains its folds with main.py, whose output goes to a log of the review's:
    SIGTERM to review.py once fold 0 has logged step 3 stops every process, one line says what
    is kept, fold 0's checkpoint holds the step reached; the same command then resumes fold 0
    from that step, timed for the steps left, and the summary says the run went on."""
    data, out = review_cases.make_voc(str(tmp_path / 'data')), tmp_path / 'out'
    command = [sys.executable, 'review.py', '--data=%s' % data, '--output_dir=%s' % out,
               '--folds=2', '--steps=60', '--hparams=%s,log_every_n_steps=1' % TINY_HPARAMS]
    fold_log = str(out / 'logs' / 'train-fold-0.log')
    status, output, pids, _ = signal_during_training(
        command, str(tmp_path / 'first.log'), lambda _: max(_steps(_read(fold_log)) or [0]) >= 3,
        [signal.SIGTERM])
    assert status == 143, output[-4000:]
    step = _latest_step(str(out / 'review' / 'folds' / 'fold-0' / 'model'))
    assert step is not None and step >= 3, _read(fold_log)[-4000:]
    assert 'main.py: stopped by SIGTERM at step %d' % step in _read(fold_log)
    assert output.splitlines()[-1] == (
        'review: stopped by SIGTERM during the label review; what the review finished is kept; '
        'rerun the same command to continue'), output[-4000:]
    assert len(pids) >= 2 and 'Traceback' not in output

    rerun = run_process(command, timeout=900, env=python_env())
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert re.search(r"fold 0: resuming at step %d of 60 on \d+ images, %d steps left, about "
                     r"\d+ min" % (step, 60 - step), rerun.stdout), rerun.stdout[-4000:]
    assert re.search(r'time +[\d.]+ min this run, which went on from a stopped one \(planned '
                     r'[\d.]+ for the whole review\)', rerun.stdout), rerun.stdout[-4000:]


def test_sigint_to_bench_ends_its_runs_and_says_so(tmp_path):
    """bench.py train runs main.py --benchmark in a session of its own (no terminal's Ctrl-C
    reaches it): SIGINT to bench once the run trains (its temporary model_dir, under TMPDIR,
    has the first checkpoint). A benchmark keeps no result from a stopped run (its model_dir
    is temporary), so nothing is resumed: the rerun measures again."""
    command = [sys.executable, 'bench.py', 'train', '--batch_sizes=2', '--steps=5000',
               '--warmup=1', '--hparams=%s' % TINY_HPARAMS]

    def training(_):
        return glob.glob(str(tmp_path / 'bench-train-*' / 'model.ckpt-0.index'))
    status, output, pids, _ = signal_during_training(
        command, str(tmp_path / 'bench.log'), training, [signal.SIGINT],
        env={'TMPDIR': str(tmp_path)})
    assert status == 130, output[-4000:]
    assert len(pids) >= 2, pids  # bench.py and main.py.
    assert output.splitlines()[-1] == (
        'bench.py: stopped by SIGINT during `bench.py train`; its runs were ended and no '
        'result is kept (results are printed and written once every run has ended); rerun '
        'the same command to measure'), output[-4000:]
    assert 'BENCHMARK' not in output
    assert not glob.glob(str(tmp_path / 'bench-train-*'))  # Its temporary model_dir went.
