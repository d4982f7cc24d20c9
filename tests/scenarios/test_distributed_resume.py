"""SIGKILL one rank of a real `mpirun -np 2` training run, then rerun the same command: the job
stops, the last checkpoint named in `checkpoint` is whole, and the rerun resumes from it on
both ranks. The rerun then meets the other fault of a one-box job: its rank 1 stopped
(SIGSTOP), which the launcher's heartbeat watch names after the stall time-out (the same on a
second box: test_multibox_stalls.py). A rerun that ends whole, with both ranks' weights equal to
an uninterrupted run's: test_preemption_signals.py."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from cli_runs import python_env, started, tiny_flags
from test_multibox import act_on_second_box_rank, end_process, ranks_of

pytestmark = pytest.mark.slow  # Real mpirun -np 2 training, killed and rerun.

RANK_CHECKSUM_RE = re.compile(
    r'\[\d+,(\d+)\]<std(?:out|err)>:.*final weights at step (\d+): checksum (\S+)')
STEP_RE = re.compile(r'step (\d+)/\d+ loss')
TOTAL_STEPS = 100  # 2 steps per epoch x 50 epochs: running when it is killed, then stopped.
# The user's stall time-out: the watch's is what is tested, not its length (launch/heartbeat.py).
STALL = {'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '20'}


@contextlib.contextmanager
def _launched(flags, log_path):
    """The launcher in a session of its own (cli_runs.started: killed with its group on leaving
    the block), its output (mpirun's --tag-output) to log_path."""
    with open(log_path, 'w') as log, started(
            [sys.executable, 'demo_efficientdet.py', '--use_horovod', '2'] + flags,
            env=python_env(STALL), stdout=log, stderr=subprocess.STDOUT) as launcher:
        yield launcher


def _descendants(root_pid):
    """Process ids below root_pid, read from /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/stat' % entry) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found += children.get(pid, [])
        todo += children.get(pid, [])
    return found


def _rank_pids(root_pid):
    """{MPI rank: pid} of the rank processes below root_pid."""
    ranks = {}
    for pid in _descendants(root_pid):
        try:
            with open('/proc/%d/environ' % pid, 'rb') as f:
                env = dict(item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item)
        except OSError:
            continue
        if b'OMPI_COMM_WORLD_RANK' in env:
            ranks[int(env[b'OMPI_COMM_WORLD_RANK'])] = pid
    return ranks


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_until(predicate, seconds, poll=0.2):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()


def _kill_tree(process, known_pids):
    """SIGKILLs whatever the launcher started that is still alive: the launcher starts mpirun
    in a process group of its own and Open MPI puts each rank in one of its own, so
    cli_runs.started's kill of the launcher's group (which then reaps the launcher) misses
    them."""
    for pid in set(known_pids) | set(_descendants(process.pid)):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _checkpointed_step(model_dir):
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit('-', 1)[1]) if latest else 0


@pytest.mark.timeout(1500)  # Two mpirun trainings, the second ended by the stall time-out.
def test_killing_rank1_stops_the_job_the_rerun_resumes_and_a_stopped_rank_1_ends_it(
        tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'model')
    # 2 per rank (tiny_flags), global batch 4; 8 examples per epoch -> 2 steps per epoch.
    flags = tiny_flags(tiny_dataset, model_dir, '--mode=train',
                       '--num_examples_per_epoch=8', '--num_epochs=%d' % (TOTAL_STEPS // 2),
                       '--cp_every_n_steps=2')
    log_path = str(tmp_path / 'killed.log')
    with _launched(flags, log_path) as launcher:
        pids = []
        try:
            assert _wait_until(lambda: _checkpointed_step(model_dir) > 0
                               or launcher.poll() is not None,
                               900), 'no checkpoint after step 0 within 900 s'
            ranks = _rank_pids(launcher.pid)
            pids = list(ranks.values())
            assert launcher.poll() is None and sorted(ranks) == [0, 1], \
                open(log_path).read()[-4000:]
            os.kill(ranks[1], signal.SIGKILL)
            killed = time.monotonic()
            returncode = launcher.wait(timeout=120)
            seconds = time.monotonic() - killed
            assert returncode != 0
            assert _wait_until(lambda: not _alive(ranks[0]), 10), 'rank 0 outlived the job'
        finally:
            _kill_tree(launcher, pids)
    assert seconds < 60, 'the job took %.0f s to stop after rank 1 died' % seconds

    latest = tf.train.latest_checkpoint(model_dir)
    killed_at = int(latest.rsplit('-', 1)[1])
    assert 0 < killed_at < TOTAL_STEPS
    reader = tf.train.load_checkpoint(latest)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)  # Every tensor is readable: the checkpoint is whole.
    assert reader.get_tensor('global_step') == killed_at

    # The rerun resumes on both ranks; once both have trained past the resumed step (one rank
    # alone cannot: every step all-reduces), rank 1 is stopped.
    stopped = {}
    stopper = act_on_second_box_rank(model_dir, signal.SIGSTOP, stopped,
                                     after_step=killed_at + 2, host=None)
    log_path = str(tmp_path / 'rerun.log')
    try:
        with _launched(flags, log_path) as launcher:
            try:
                returncode = launcher.wait(timeout=900)
                ended = time.monotonic()
            finally:
                _kill_tree(launcher, [])
        stopper.join(timeout=10)
        output = open(log_path).read()
        assert stopped, 'rank 1 was never stopped: %s' % output[-4000:]
        assert returncode != 0, output[-4000:]
        assert 'resuming from %s (step %d)' % (latest, killed_at) in output, output[-4000:]
        # A fresh start would first log step 2 (<= killed_at): the first step is not logged.
        steps = [int(step) for step in STEP_RE.findall(output)]
        assert steps and min(steps) > killed_at, steps
        assert _checkpointed_step(model_dir) >= killed_at + 2  # both ranks went on, then kept
        assert ('demo_efficientdet.py: rank 1 of 2 (on localhost, pid %d) has not answered for'
                % stopped['pid']) in output, output[-4000:]
        assert 15 <= ended - stopped['at'] < 20 + 60, ended - stopped['at']
        assert not ranks_of(model_dir), 'ranks outlived the job'
        assert not os.path.exists(os.path.join(model_dir, 'heartbeat'))  # local, and removed
    finally:
        if stopped:
            end_process(stopped['pid'])
