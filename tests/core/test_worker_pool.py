"""core/worker_pool.py: worker processes the code owns. Every ending is checked for what the
caller sees (the value, the error, the time it took) and for what is left (no worker alive)."""
import os
import re
import signal
import time

import pytest

import pool_jobs
from efficientdet_hpu.core import worker_pool


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open('/proc/%d/stat' % pid) as stream:  # A zombie is dead; its parent reaps it later.
        return stream.read().rsplit(')', 1)[1].split()[0] != 'Z'


def _started_pids(tmp_path, count, deadline=60):
    """The pids the 'sleep' jobs wrote, once `count` of them have started."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        files = list(tmp_path.glob('started-*'))
        if len(files) >= count and all(path.read_text() for path in files):
            return [int(path.read_text()) for path in files]
        time.sleep(0.05)
    raise AssertionError('the sleeping jobs did not start in %d s' % deadline)


def test_every_job_once_with_progress_from_two_workers():
    seen = []
    jobs = [('square', n) for n in range(8)]
    values = list(worker_pool.run_unordered(pool_jobs.run, jobs, 2, on_progress=seen.append))
    assert sorted(values) == [n * n for n in range(8)]
    assert seen and seen[-1] == sum(range(8)) and seen == sorted(seen)


def test_one_worker_runs_the_jobs_in_this_process_and_reports_each_tick():
    seen = []
    values = list(worker_pool.run_unordered(pool_jobs.run, [('square', 2), ('square', 3)], 1,
                                            on_progress=seen.append))
    assert values == [4, 9] and seen == [1, 2, 3, 4, 5]
    pids = list(worker_pool.run_unordered(pool_jobs.run, [('pid', 0)], 1))
    assert pids == [os.getpid()]


def test_the_first_error_stops_every_worker_within_seconds(tmp_path):
    started = str(tmp_path / 'started-a')
    jobs = [('sleep', started), ('fail', ('val/000123.jpg', started)),
            ('sleep', str(tmp_path / 'started-b')), ('square', 3)]
    start = time.monotonic()
    with pytest.raises(pool_jobs.DataProblem, match="'val/000123.jpg' is truncated") as raised:
        list(worker_pool.run_unordered(pool_jobs.run, jobs, 2))
    assert time.monotonic() - start < 30  # Worker start-up plus STOP_SECONDS, not 120 s.
    assert isinstance(raised.value.__cause__, worker_pool.WorkerTraceback)
    assert 'line' in str(raised.value.__cause__) and 'DataProblem' in str(raised.value.__cause__)
    (sleeper,) = _started_pids(tmp_path, 1, deadline=1)
    assert not _alive(sleeper)


def test_a_killed_worker_is_named_and_the_others_are_stopped(tmp_path):
    jobs = [('sleep', str(tmp_path / 'started-a')), ('die', str(tmp_path / 'started-a'))]
    with pytest.raises(worker_pool.WorkerFailure) as raised:
        list(worker_pool.run_unordered(pool_jobs.run, jobs, 2, name='converter worker'))
    message = str(raised.value)
    assert re.match(r'converter worker [12] \(pid [0-9]+\) was killed by SIGKILL', message)
    assert 'job 2 of 2' in message and 'out-of-memory killer' in message
    (sleeper,) = _started_pids(tmp_path, 1, deadline=1)
    assert not _alive(sleeper)


def test_a_stall_ends_the_run_with_the_jobs_named(tmp_path, monkeypatch):
    jobs = [('sleep', str(tmp_path / 'started-a')), ('sleep', str(tmp_path / 'started-b'))]
    start = time.monotonic()
    with pytest.raises(worker_pool.WorkerFailure, match=r'in 3 s \(jobs \[1, 2\] still running'):
        list(worker_pool.run_unordered(pool_jobs.run, jobs, 2, stall_seconds=3))
    assert time.monotonic() - start < 30
    assert not any(_alive(pid) for pid in _started_pids(tmp_path, 2, deadline=1))


def test_closing_the_generator_early_stops_the_workers(tmp_path):
    jobs = [('square', 1), ('sleep', str(tmp_path / 'started-a')), ('square', 2)]
    results = worker_pool.run_unordered(pool_jobs.run, jobs, 2)
    assert next(results) in (1, 4)
    pids = _started_pids(tmp_path, 1)
    results.close()
    assert not any(_alive(pid) for pid in pids)


def test_an_error_that_cannot_travel_arrives_as_its_type_and_text():
    with pytest.raises(RuntimeError, match='Unpicklable: cannot travel'):
        list(worker_pool.run_unordered(pool_jobs.run, [('unpicklable', 0), ('square', 1)], 2))


def test_an_initializer_error_is_raised_in_the_parent():
    with pytest.raises(RuntimeError, match='the worker could not start'):
        list(worker_pool.run_unordered(pool_jobs.run, [('square', 1), ('square', 2)], 2,
                                       initializer=pool_jobs.failing_initializer))


def test_stop_kills_a_worker_that_ignores_sigterm(monkeypatch):
    monkeypatch.setattr(worker_pool, 'STOP_SECONDS', 1.0)
    workers = worker_pool._start(1, pool_jobs.run, signal.signal,  # pylint: disable=protected-access
                                 (signal.SIGTERM, signal.SIG_IGN), 'stubborn')
    workers[0].connection.send((0, ('pid', 0)))
    assert workers[0].connection.recv() == ('value', workers[0].process.pid)
    start = time.monotonic()
    worker_pool.stop(workers)
    assert workers[0].process.exitcode == -signal.SIGKILL
    assert time.monotonic() - start < 5
