"""core/processes.py: a child and everything it starts end together, at the deadline or after;
a stop signal to the parent reaches the child once, the parent waits for its clean end within
a deadline, says so in one line and exits 128+N (a driver process, signalled from outside)."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from cli_runs import signalled, started, still_running
from efficientdet_hpu.core import processes


def _gone(pid, seconds=5):
    return not still_running([pid], seconds)


def test_output_and_status_of_a_command():
    result = processes.run(['sh', '-c', 'echo out; echo err >&2; exit 3'], timeout=30)
    assert (result.returncode, result.stdout) == (3, 'out\nerr\n')
    result = processes.run(['sh', '-c', 'cat; echo err >&2'], timeout=30,
                           stderr=subprocess.PIPE, input='in\n')
    assert (result.stdout, result.stderr) == ('in\n', 'err\n')


def test_the_deadline_ends_a_grandchild_that_holds_the_pipe():
    """subprocess.run's own timeout would wait for the backgrounded sleep: it keeps stdout."""
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        processes.run(['sh', '-c', 'sleep 120 & echo $!; wait'], timeout=2)
    assert time.monotonic() - start < 20
    grandchild = int(raised.value.output.split()[0])
    assert _gone(grandchild)


def test_what_a_finished_command_left_running_is_ended():
    result = processes.run(['sh', '-c', 'sleep 120 >/dev/null 2>&1 & echo $!'], timeout=30)
    assert result.returncode == 0
    assert _gone(int(result.stdout.split()[0]))


def test_a_grandchild_in_a_process_group_of_its_own_is_ended_too():
    """As mpirun starts its ranks: each in a process group of its own, in the same session."""
    code = ('import os, subprocess; child = subprocess.Popen(["sleep", "120"], '
            'preexec_fn=os.setpgrp); print(child.pid, flush=True); child.wait()')
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        processes.run([sys.executable, '-c', code], timeout=3)
    assert time.monotonic() - start < 20
    assert _gone(int(raised.value.output.split()[0]))


def test_streaming_hands_over_each_line_as_it_comes_and_the_status():
    lines = []
    status, stopped = processes.run_streaming(
        ['sh', '-c', 'echo one; echo two >&2; printf three; exit 4'], 30, lines.append)
    assert (status, stopped, lines) == (4, False, ['one', 'two', 'three'])


def test_streaming_soft_deadline_signals_once_and_the_child_finishes_its_work():
    """As a training run at the time budget: SIGTERM, then it writes its last line and exits."""
    lines = []
    code = ('import signal, sys, time\n'
            'signal.signal(signal.SIGTERM, lambda *a: (print("saved", flush=True), sys.exit(143)))\n'
            'print("training", flush=True)\n'
            'time.sleep(60)\n')
    start = time.monotonic()
    status, stopped = processes.run_streaming([sys.executable, '-c', code], 30, lines.append,
                                              stop_after=1.5)
    assert (status, stopped, lines) == (143, True, ['training', 'saved'])
    assert time.monotonic() - start < 20


def test_a_soft_deadline_given_as_a_function_follows_what_the_child_reports():
    """As the fine-tune's time-budget stop once its probe has read the machine's load: the stop
    moves earlier when a line the child writes says so."""
    lines, moved = [], {}

    def on_line(line):
        lines.append(line)
        if line == 'slow machine':
            moved['stop'] = 0.5
    code = ('import signal, sys, time\n'
            'signal.signal(signal.SIGTERM, lambda *a: (print("saved", flush=True), sys.exit(143)))\n'
            'print("slow machine", flush=True)\n'
            'time.sleep(60)\n')
    start = time.monotonic()
    status, stopped = processes.run_streaming([sys.executable, '-c', code], 60, on_line,
                                              stop_after=lambda: moved.get('stop', 45.0))
    assert (status, stopped, lines) == (143, True, ['slow machine', 'saved'])
    assert time.monotonic() - start < 20  # Not the 45 s first asked.


def test_streaming_hard_deadline_kills_the_session():
    lines = []
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run_streaming(['sh', '-c', 'echo $$; trap "" TERM; sleep 120'], 2,
                                lines.append, stop_after=1)
    assert time.monotonic() - start < 20
    assert _gone(int(lines[0]))


# A child that reports its pid and that of a grandchild (a `sleep` in the same session, as a
# converter's workers), then each stop signal it gets; it ends as main.py does, 128+N, a
# half a second after the first signal (a duplicate forwarded meanwhile would be reported), or never
# ('hang': a step that does not end).
CHILD = '''
import os, signal, subprocess, sys, time
grandchild = subprocess.Popen(['sleep', '120'])
got = []
def on_stop(signum, _frame):
    got.append(signum)
    print('got', signal.Signals(signum).name, flush=True)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, on_stop)
print('pids', grandchild.pid, flush=True)
with open(os.environ['PIDS_FILE'], 'w') as stream:  # Also when the parent keeps the output.
    stream.write('pids %d %d' % (os.getpid(), grandchild.pid))
while not got or sys.argv[1:] == ['hang']:
    time.sleep(0.05)
time.sleep(0.5)
sys.exit(128 + got[0])
'''

# The parent: the child under processes.stops_forwarded (run_streaming, run or none), its
# lines echoed; at a stop, Stopped's line and its exit status.
DRIVER = '''
import os, sys, time
from efficientdet_hpu.core import processes
mode, grace, child = sys.argv[1], float(sys.argv[2]), [sys.executable, '-c', sys.argv[3]]
child += sys.argv[4:]
print('driver', os.getpid(), flush=True)
try:
    with processes.stops_forwarded('driver', grace):
        if mode == 'streaming':
            processes.run_streaming(child, 60, lambda line: print(line, flush=True))
        elif mode == 'run':
            print(processes.run(child, 60).stdout, flush=True)
        else:
            open(os.environ['PIDS_FILE'], 'w').write('pids')
            time.sleep(60)
except processes.Stopped as stop:
    stop.kept = 'child status %s' % stop.child_status
    print(stop.line('driver'), flush=True)
    sys.exit(stop.exit_status)
'''


@contextlib.contextmanager
def _driven(tmp_path, mode, grace=30, *child_args, prefix=()):
    """The driver (cli_runs.started: a session of its own, killed on leaving the block), its
    output in a file; yields (process, output reader)."""
    command = list(prefix) + [sys.executable, '-c', DRIVER, mode, str(grace), CHILD]
    with open(tmp_path / 'driver.log', 'w') as log, started(
            command + list(child_args), env=dict(os.environ, PIDS_FILE=str(tmp_path / 'pids')),
            stdout=log, stderr=subprocess.STDOUT) as process:
        yield process, lambda: (tmp_path / 'driver.log').read_text()


def _wait_for(read, text, seconds=30):
    end = time.monotonic() + seconds
    while text not in read() and time.monotonic() < end:
        time.sleep(0.05)
    assert text in read(), read()


def _pids(tmp_path):
    """The child's and grandchild's pids, once the child has its handlers."""
    _wait_for(lambda: (tmp_path / 'pids').read_text() if (tmp_path / 'pids').exists() else '',
              'pids')
    return [int(pid) for pid in (tmp_path / 'pids').read_text().split()[1:]]


def _stop(tmp_path, mode, signals, child_args=(), grace=30, gap=0.0):
    """Sends `signals` to the driver once its child is running (gap seconds apart); returns
    (exit status, output, seconds from the first signal to the driver's end, the child's and
    grandchild's pids still running 5 s after it)."""
    with _driven(tmp_path, mode, grace, *child_args) as (process, read):
        pids = _pids(tmp_path)
        status, seconds, left = signalled(process, signals, gap, 60, pids, 5)
        return status, read(), seconds, left


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_reaches_the_child_once_and_the_parent_exits_128_plus_n(tmp_path, signum):
    status, output, _, left = _stop(tmp_path, 'streaming', [signum])
    name = signal.Signals(signum).name
    assert status == 128 + signum, output
    assert output.count('got ') == 1 and 'got %s' % name in output, output
    assert 'driver: %s: passed on to the running command' % name in output
    assert output.splitlines()[-1] == 'driver: stopped by %s; child status %d' % (
        name, 128 + signum), output
    assert not left, left  # The grandchild too.


def test_a_stop_reaches_a_child_of_run_too(tmp_path):
    status, output, _, left = _stop(tmp_path, 'run', [signal.SIGTERM])
    assert status == 143 and 'driver: stopped by SIGTERM; child status 143' in output, output
    assert not left, left


def test_the_same_signal_twice_at_once_is_one_stop(tmp_path):
    """As `timeout` sends it (to the command, then to its process group) and make (its
    recipe's process group got it too)."""
    status, output, _, _ = _stop(tmp_path, 'streaming', [signal.SIGTERM, signal.SIGTERM])
    assert status == 143 and output.count('got ') == 1, output
    assert 'killed at once' not in output


def test_a_second_signal_ends_at_once(tmp_path):
    status, output, seconds, left = _stop(
        tmp_path, 'streaming', [signal.SIGTERM, signal.SIGINT], child_args=['hang'],
        gap=processes.SAME_STOP_SECONDS + 0.5)
    assert status == 130, output
    assert seconds < 10 + processes.SAME_STOP_SECONDS, seconds
    assert ('driver: stopped by SIGINT (a second stop signal: its processes were killed at '
            'once)' in output), output
    assert not left, left


def test_a_child_that_does_not_end_is_killed_at_the_deadline(tmp_path):
    status, output, seconds, left = _stop(tmp_path, 'streaming', [signal.SIGHUP],
                                          child_args=['hang'], grace=2)
    assert status == 129 and 'child status -9' in output, output
    assert 2 <= seconds < 15, seconds
    assert not left, left


def test_a_signal_while_no_child_runs_stops_at_once(tmp_path):
    status, output, seconds, _ = _stop(tmp_path, 'idle', [signal.SIGTERM])
    assert status == 143 and seconds < 10, output
    assert output.splitlines()[-1] == 'driver: stopped by SIGTERM; child status None'


def test_a_sighup_ignored_from_the_start_stays_ignored(tmp_path):
    """nohup: the command goes on after a hangup; SIGTERM still stops it."""
    with _driven(tmp_path, 'streaming', prefix=['nohup']) as (process, read):
        _pids(tmp_path)
        process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert process.poll() is None and 'got' not in read(), read()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 143, read()


def test_kill_tree_ends_a_child_and_its_children_in_process_groups_of_their_own():
    """As the launcher ends mpirun and its ranks (each rank in a process group of its own, in
    the launcher's session)."""
    code = ('import os, subprocess, sys, time\n'
            'ranks = [subprocess.Popen(["sleep", "120"], preexec_fn=os.setpgrp) '
            'for _ in range(2)]\n'
            'print(*[rank.pid for rank in ranks], flush=True)\n'
            'time.sleep(120)\n')
    with started([sys.executable, '-c', code], stdout=subprocess.PIPE) as process:
        ranks = [int(pid) for pid in process.stdout.readline().split()]
        processes.kill_tree(process.pid)
        assert process.wait(10) == -signal.SIGKILL
        assert all(_gone(pid) for pid in ranks), ranks
