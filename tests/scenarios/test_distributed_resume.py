"""SIGKILL one rank of a real `mpirun -np 2` training run, then rerun the same command: the job
stops, the last checkpoint named in `checkpoint` is whole, and the rerun resumes from it on
both ranks."""
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

pytestmark = pytest.mark.slow  # Real mpirun -np 2 training, killed and rerun.

RANK_CHECKSUM_RE = re.compile(
    r'\[\d+,(\d+)\]<std(?:out|err)>:.*final weights at step (\d+): checksum (\S+)')
STEP_RE = re.compile(r'step (\d+)/\d+ loss')
TOTAL_STEPS = 6  # 2 steps per epoch x 3 epochs: still running when step 2 is checkpointed.


@contextlib.contextmanager
def _launched(flags, log_path):
    """The launcher in a session of its own (cli_runs.started: killed with its group on leaving
    the block), its output (mpirun's --tag-output) to log_path."""
    with open(log_path, 'w') as log, started(
            [sys.executable, 'demo_efficientdet.py', '--use_horovod', '2'] + flags,
            env=python_env(), stdout=log, stderr=subprocess.STDOUT) as launcher:
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


def test_killing_rank1_stops_the_job_and_the_rerun_resumes_on_both_ranks(tiny_dataset, tmp_path):
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

    log_path = str(tmp_path / 'rerun.log')
    with _launched(flags, log_path) as launcher:
        try:
            returncode = launcher.wait(timeout=900)
        finally:
            _kill_tree(launcher, [])
    output = open(log_path).read()
    assert returncode == 0, output[-6000:]
    assert 'resuming from %s (step %d)' % (latest, killed_at) in output, output[-4000:]
    # A fresh start would first log step 2 (<= killed_at): the first step is not logged.
    steps = [int(step) for step in STEP_RE.findall(output)]
    assert steps and min(steps) > killed_at and max(steps) == TOTAL_STEPS, steps
    final = {int(rank): (int(step), checksum)
             for rank, step, checksum in RANK_CHECKSUM_RE.findall(output)}
    assert sorted(final) == [0, 1], output[-4000:]
    assert final[0] == final[1] and final[0][0] == TOTAL_STEPS, final
    assert _checkpointed_step(model_dir) == TOTAL_STEPS
