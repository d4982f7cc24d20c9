"""core/processes.py: a child and everything it starts end together, at the deadline or after."""
import os
import subprocess
import sys
import time

import pytest

from efficientdet_hpu.core import processes


def _gone(pid, seconds=5):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open('/proc/%d/stat' % pid) as stream:
            if stream.read().rsplit(')', 1)[1].split()[0] == 'Z':
                return True
        time.sleep(0.05)
    return False


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


def test_streaming_hard_deadline_kills_the_session():
    lines = []
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run_streaming(['sh', '-c', 'echo $$; trap "" TERM; sleep 120'], 2,
                                lines.append, stop_after=1)
    assert time.monotonic() - start < 20
    assert _gone(int(lines[0]))


def test_streaming_on_an_interrupt_lets_the_child_finish_its_stop():
    """Ctrl-C reaches the fine-tune, not main.py in its own session: the child is sent the
    stop signal and its last lines are read before the interrupt goes on."""
    lines = []
    code = ('import signal, sys, time\n'
            'signal.signal(signal.SIGTERM, lambda *a: (print("checkpoint", flush=True), '
            'sys.exit(143)))\n'
            'print("training", flush=True)\n'
            'time.sleep(60)\n')

    def interrupt_on_training(line):
        lines.append(line)
        if line == 'training':
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        processes.run_streaming([sys.executable, '-c', code], 30, interrupt_on_training,
                                interrupt_grace=20)
    assert lines == ['training', 'checkpoint']
