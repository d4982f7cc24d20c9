"""A test run stopped by SIGTERM (a CI's deadline, `kill`) or SIGHUP (a closed terminal) ends
with it every command its tests started, though each runs in a session of its own that the
signal does not reach (tests/cli_runs.py: stops_end_the_commands), with and without xdist's
workers between. No TensorFlow: the stopped pytest runs tests/fixtures/stopped_suite_probe.py.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from cli_runs import REPO, started, still_running

PROBE = os.path.join('tests', 'fixtures', 'stopped_suite_probe.py')


def _pids(path, process, seconds=120):
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < end, 'the probe wrote no pids in %d s' % seconds
        time.sleep(0.1)
    with open(path) as stream:
        return [int(pid) for pid in stream.read().split()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize('signum, workers', [(signal.SIGTERM, ['-p', 'no:xdist']),
                                             (signal.SIGHUP, ['-p', 'no:xdist']),
                                             (signal.SIGTERM, ['-n', '1'])])
def test_a_stopped_test_run_ends_the_commands_its_tests_started(tmp_path, signum, workers):
    path, pids = str(tmp_path / 'pids'), []
    deadlines = tmp_path / 'deadlines'  # Its own: the stopped run's test leaves its file there.
    deadlines.mkdir()
    command = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider'] + workers + [PROBE]
    try:
        env = dict(os.environ, PROBE_PIDS=path, EFFICIENTDET_TEST_DEADLINE_DIR=str(deadlines))
        with started(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT) as process:
            pids = _pids(path, process)
            assert still_running(pids, 0) == pids  # Both run, in a session of their own.
            process.send_signal(signum)
            process.wait(60)
            assert process.returncode == -signum, process.stdout.read()
            assert still_running(pids, 10) == []
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
