"""The Makefile's long targets as a user runs them, with a stand-in interpreter: `make demo` and
`make trees` run every step with $(VENV)'s python, and a stop signal sent as a terminal, `kill`
or `timeout` sends it reaches the running step exactly once (tools/stop_signals.sh); the step
ends cleanly, make ends with the signal, and nothing of the run is left.

The stand-in (VENV=<tmp>/venv, `make -o venv` so no venv is built) records each command it is
run as and ends; as main.py (unless STAND_IN_TRAINS=0) it trains until a stop signal, records
it, and exits 128+N half a second later (a duplicate passed on meanwhile would be recorded
too)."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cli_runs import started
from efficientdet_hpu.core import processes

pytestmark = pytest.mark.skipif(shutil.which('make') is None, reason='needs GNU make')

STAND_IN = '''#!%s
import os, signal, sys, time
with open(os.environ['STAND_IN_LOG'], 'a') as log:
    log.write('%%s %%s\\n' %% (sys.argv[0], ' '.join(sys.argv[1:])))
if sys.argv[1:2] != ['main.py'] or os.environ.get('STAND_IN_TRAINS') == '0':
    sys.exit(0)
got = []
def on_stop(signum, _frame):
    got.append(signum)
    with open(os.environ['STAND_IN_LOG'], 'a') as log:
        log.write('main.py got %%s\\n' %% signal.Signals(signum).name)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, on_stop)
ready = os.environ['STAND_IN_LOG'] + '.training'
with open(ready + '.tmp', 'w') as stream:  # Whole when it appears: the test reads the pid.
    stream.write(str(os.getpid()))
os.replace(ready + '.tmp', ready)
end = time.monotonic() + 60
while not got and time.monotonic() < end:
    time.sleep(0.05)
time.sleep(0.5)
print('main.py: stopped by %%s; checkpoint kept' %% signal.Signals(got[0]).name, flush=True)
sys.exit(128 + got[0])
''' % sys.executable


@pytest.fixture
def venv(tmp_path):
    """A VENV whose bin/python is the stand-in; its log path."""
    python = tmp_path / 'venv' / 'bin' / 'python'
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)
    return str(tmp_path / 'venv'), str(tmp_path / 'commands.log')


def _make(target, venv, tmp_path, extra_env=None):
    """`make -o venv TARGET VENV=...` (cli_runs.started: a session of its own, as a terminal
    job is a process group of its own; killed on leaving the block)."""
    root, log = venv
    # Not QUIET_PIDS: .ci/run's set-up jobs, which the stand-in suite would wait for.
    inherited = {name: value for name, value in os.environ.items() if name != 'QUIET_PIDS'}
    env = dict(inherited, STAND_IN_LOG=log, TREES_DIR=str(tmp_path / 'trees'),
               RUNS_DIR=str(tmp_path / 'runs'), STOP_GRACE_SECONDS='30', **(extra_env or {}))
    command = ['make', '--no-print-directory', '-o', 'venv', target, 'VENV=%s' % root,
               'DEMO_DIR=%s' % (tmp_path / 'demo'), 'DATA_DIR=%s' % (tmp_path / 'data')]
    return started(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _commands(log):
    with open(log) as stream:
        return [line.split(' ', 1) for line in stream.read().splitlines()]


def _run_make(target, venv, tmp_path):
    with _make(target, venv, tmp_path, extra_env={'STAND_IN_TRAINS': '0'}) as process:
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    commands = _commands(venv[1])
    assert {interpreter for interpreter, _ in commands} == {
        os.path.join(venv[0], 'bin', 'python')}, commands
    return [args.split()[1] if args.startswith('-m ') else args.split()[0]
            for _, args in commands]


def test_make_demo_runs_every_step_with_the_venvs_python(venv, tmp_path):
    steps = _run_make('demo', venv, tmp_path)
    assert steps == ['dataset.synthetic_coco'] + ['dataset.create_coco_tfrecord'] * 2 + [
        'main.py'], steps


def test_make_test_runs_the_suite_then_the_tests_held_to_a_budget_alone(venv, tmp_path):
    """tools/run_tests.sh: the suite on two workers without the `alone` tests, then those
    without xdist (so nothing else of the suite runs beside them)."""
    with _make('test', venv, tmp_path, extra_env={'STAND_IN_TRAINS': '0'}) as process:
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    commands = [args for _, args in _commands(venv[1])]
    assert commands == [
        '-m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30 -m not alone tests',
        '-m pytest -q -p no:xdist -m alone tests'], commands


def test_make_trees_runs_every_step_with_the_venvs_python(venv, tmp_path):
    for folder in ('trees/download/deepforest', 'trees/download/lite0',  # Fetched already.
                   'runs/pretrained/val_photo', 'runs/random/val_photo'):
        (tmp_path / folder).mkdir(parents=True)
    steps = _run_make('trees', venv, tmp_path)
    assert steps == (['dataset.voc_to_coco'] * 2
                     + ['dataset.create_coco_tfrecord', 'dataset.verify_tfrecords'] * 2
                     + ['main.py'] * 2 + ['inference.py', 'efficientdet_hpu.cli.analyze'] * 2
                     + ['-']), steps  # '-': the table and the picture, a script on stdin.


@pytest.mark.parametrize('signum, whole_group, make_status', [
    (signal.SIGTERM, False, -signal.SIGTERM),  # `kill MAKE_PID`: make passes it on.
    (signal.SIGTERM, True, -signal.SIGTERM),   # `timeout make demo`: make's group, and make.
    (signal.SIGINT, True, -signal.SIGINT),     # Ctrl-C in the terminal.
    (signal.SIGHUP, True, -signal.SIGHUP),     # The terminal closed.
])
def test_a_stop_signal_to_make_demo_reaches_training_once(venv, tmp_path, signum, whole_group,
                                                          make_status):
    with _make('demo', venv, tmp_path) as process:
        _wait_for_file(venv[1] + '.training')
        with open(venv[1] + '.training') as stream:
            trainer = int(stream.read())
        members = _session(process.pid)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
        assert _gone(members), output  # Before leaving the block, which kills the session.
    name = signal.Signals(signum).name
    got = [args for _, args in _commands(venv[1]) if args.startswith('got ')]
    assert got == ['got %s' % name], (got, output)
    assert process.returncode == make_status, output
    assert 'main.py: stopped by %s; checkpoint kept' % name in output
    assert output.count('demo.sh: stopped by %s; ' % name) == 1, output
    assert trainer in members, members


def _session(session_id):
    return [pid for pid, (_, _, session) in processes.process_table().items()
            if session == session_id]


def _gone(pids, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not set(pids) & set(processes.process_table()):
            return True
        time.sleep(0.1)
    return False


def _wait_for_file(path, seconds=60):
    end = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
    assert os.path.exists(path), path


def test_make_venv_passes_python_and_venv_to_the_set_up(tmp_path):
    """`make test PYTHON=python3.10 VENV=.venv310` (the Makefile's header): PYTHON reaches
    tools/setup_env.sh, which names an interpreter that is not there before making VENV."""
    missing = str(tmp_path / 'no-such-python')
    with started(['make', '--no-print-directory', 'venv', 'PYTHON=%s' % missing,
                  'VENV=%s' % (tmp_path / 'venv310')], stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT) as process:
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert 'setup_env.sh: error: PYTHON=%s is not a program' % missing in output
    assert not (tmp_path / 'venv310').exists()


SCRIPT = '''set -euo pipefail
STOP_GRACE_SECONDS=30
source %s
step bash -c 'trap "sleep 1; echo step: stopped; exit 0" TERM; touch %s; while :; do sleep 0.1; done'
echo "script: after the step"
'''


def test_the_same_stop_passed_on_again_while_the_step_ends_does_not_end_the_script(tmp_path):
    """make passes SIGTERM on to a recipe whose process group got it too: the second one,
    arriving while the script waits for its step, is the same stop. The script still waits
    for the step and says it stopped (a bare `return` in the handler once ended it silently,
    exit 143, with the step running)."""
    ready = tmp_path / 'ready'
    script = tmp_path / 'script.sh'
    script.write_text(SCRIPT % (os.path.abspath('tools/stop_signals.sh'), ready))
    with started(['bash', str(script)], stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT) as process:
        _wait_for_file(str(ready), 30)
        members = _session(process.pid)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.15)  # Back in `wait`, within the half second of the same stop.
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert _gone(members), output
    assert process.returncode == 128 + signal.SIGTERM, output
    assert 'step: stopped' in output, output
    assert output.count('script.sh: stopped by SIGTERM; ') == 1, output
    assert output.index('step: stopped') < output.index('stopped by SIGTERM'), output
    assert 'after the step' not in output and 'a second stop signal' not in output, output
