"""A deadline per test, and every thread's stack when it passes (a pytest plugin: conftest.py
loads it with pytest_plugins).

pytest-timeout gives each test its deadline (pyproject.toml: `timeout`, or
@pytest.mark.timeout(N); a `slow` test without a mark gets SLOW_TIMEOUT). Its own handler
prints the other threads' stacks through pytest's terminal, which an xdist worker does not
show; this plugin takes over its timer:
- at the deadline, SIGALRM: faulthandler writes every thread's stack (C-level safe) to the
  test's stderr, shown with the failure, and the test fails;
- when the main thread cannot take the signal (stuck inside a C call), BACKSTOP_SECONDS later
  faulthandler writes the stacks to a file of this session's deadline directory and ends the
  process; the controlling pytest prints that file in its summary (xdist reports the crashed
  worker and starts another).
"""
import faulthandler
import os
import re
import signal
import sys
import tempfile

import pytest

SLOW_TIMEOUT = 900  # Seconds: a slow test (training, mpirun, export) without its own mark.
BACKSTOP_SECONDS = float(os.environ.get('EFFICIENTDET_TEST_BACKSTOP_SECONDS', 60))
_DIRECTORY_VARIABLE = 'EFFICIENTDET_TEST_DEADLINE_DIR'
_armed = {}


def pytest_configure(config):
    if not hasattr(config, 'workerinput'):  # The controller (or a run without xdist).
        os.environ.setdefault(_DIRECTORY_VARIABLE, tempfile.mkdtemp(prefix='test-deadlines-'))


@pytest.hookimpl(trylast=True)  # After conftest.py has marked the users of slow fixtures.
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker('slow') and not item.get_closest_marker('timeout'):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Arms both timers (see the module docstring); True: pytest-timeout arms none of its own."""
    seconds = settings.timeout
    if not seconds or seconds <= 0:
        return True

    def on_deadline(signum, frame):  # pylint: disable=unused-argument
        __tracebackhide__ = True  # pylint: disable=unused-variable
        sys.stderr.flush()
        print('\n+++ %s passed its deadline of %s s; the stack of every thread: +++'
              % (item.nodeid, seconds), file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail('Timeout: %s passed its deadline of %s s (every thread\'s stack is in its '
                    'captured stderr)' % (item.nodeid, seconds), pytrace=True)

    signal.signal(signal.SIGALRM, on_deadline)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    path = _backstop_path(item)
    if path:
        stream = open(path, 'w', encoding='utf-8')  # pylint: disable=consider-using-with
        stream.write('%s did not end %s s after its deadline of %s s and its process was '
                     'ended; the stack of every thread:\n' % (item.nodeid, BACKSTOP_SECONDS,
                                                              seconds))
        stream.flush()
        faulthandler.dump_traceback_later(seconds + BACKSTOP_SECONDS, exit=True, file=stream)
        _armed[item.nodeid] = (stream, path)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item):
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    armed = _armed.pop(item.nodeid, None)
    if armed:
        faulthandler.cancel_dump_traceback_later()
        stream, path = armed
        stream.close()
        os.remove(path)
    return True


def _backstop_path(item):
    directory = os.environ.get(_DIRECTORY_VARIABLE)
    if not directory or not os.path.isdir(directory):
        return None
    return os.path.join(directory, '%d-%s.txt' % (os.getpid(),
                                                  re.sub(r'[^A-Za-z0-9_.-]+', '_', item.nodeid)))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, 'workerinput'):
        return
    directory = os.environ.get(_DIRECTORY_VARIABLE)
    if not directory or not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding='utf-8', errors='replace') as stream:
            terminalreporter.section('deadline: ' + name, sep='+')
            terminalreporter.write(stream.read())
