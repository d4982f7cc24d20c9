"""The suite's own deadline (tests/deadlines.py): a planted test that hangs fails within its
deadline and prints every thread's stack, whether it sleeps in Python or is stuck where no
signal reaches it (then the backstop ends its xdist worker and the controller prints the stacks).
Each case runs a nested pytest under the project's configuration (pyproject.toml, the plugin)."""
import os
import sys
import time

import pytest

from cli_runs import REPO, run_process

# The planted hang's seconds, and the bound on the nested pytest: ended by its 3 s deadline (and
# the 2 s backstop) long before the hang would end; the bound leaves the nested pytest's start-up
# room on a busy machine (the suite's other worker training beside it).
HANG, BOUND = 600, 300
SLEEPING = '''
import threading, time
def test_sleeps():
    threading.Thread(target=time.sleep, args=(%d,), name='planted-sleeper', daemon=True).start()
    time.sleep(%d)
''' % (HANG, HANG)
STUCK = '''
import signal, time
def test_stuck():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # As a C call that never returns.
    time.sleep(%d)
''' % HANG


def _run_planted(tmp_path, source, *options, backstop=60):
    (tmp_path / 'conftest.py').write_text("pytest_plugins = ['deadlines']\n")
    (tmp_path / 'test_planted.py').write_text(source)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'tests'),
               EFFICIENTDET_TEST_DEADLINE_DIR=str(tmp_path),
               EFFICIENTDET_TEST_BACKSTOP_SECONDS=str(backstop))
    start = time.monotonic()
    result = run_process([sys.executable, '-m', 'pytest', '-c', os.path.join(REPO, 'pyproject.toml'),
                          '--rootdir', REPO, '-p', 'no:cacheprovider', '-q', '-o', 'timeout=3',
                          *options, str(tmp_path / 'test_planted.py')], timeout=BOUND + 60,
                         env=env)
    return result, time.monotonic() - start


@pytest.mark.timeout(BOUND + 120)
def test_a_sleeping_test_fails_at_its_deadline_with_every_threads_stack(tmp_path):
    result, seconds = _run_planted(tmp_path, SLEEPING)
    assert result.returncode == 1, result.stdout
    assert seconds < BOUND, seconds
    assert 'test_sleeps passed its deadline of 3.0 s' in result.stdout, result.stdout
    assert 'Timeout: ' in result.stdout
    # Both threads' stacks: the test's own line and the planted thread's.
    assert 'test_planted.py", line 5 in test_sleeps' in result.stdout, result.stdout
    assert 'Current thread 0x' in result.stdout and '\nThread 0x' in result.stdout, result.stdout


@pytest.mark.timeout(BOUND + 120)
def test_a_test_no_signal_reaches_ends_its_worker_and_the_stacks_are_printed(tmp_path):
    result, seconds = _run_planted(tmp_path, STUCK, '-n', '1', backstop=2)
    assert result.returncode == 1, result.stdout
    assert seconds < BOUND, seconds
    assert 'FAILED' in result.stdout and 'test_stuck' in result.stdout, result.stdout
    assert 'did not end 2.0 s after its deadline of 3.0 s' in result.stdout, result.stdout
    assert 'test_planted.py", line 5 in test_stuck' in result.stdout, result.stdout
