"""core/processes.py's stop_when: a line the child writes sends the stop signal, once (the
fine-tune's search stops a candidate at its evaluation, its probe a run whose steps change)."""
import sys
import time

from efficientdet_hpu.core import processes

CHILD = ('import signal, sys, time\n'
         'signal.signal(signal.SIGTERM, lambda *a: (print("saved", flush=True), sys.exit(143)))\n'
         'for step in range(1, 1000):\n'
         '    print("step %d" % step, flush=True)\n'
         '    time.sleep(0.05)\n')


def test_a_line_stops_the_child_which_finishes_its_stop():
    lines, asked = [], []

    def stop_when(line):
        asked.append(line)
        return line == 'step 5'
    start = time.monotonic()
    status, stopped = processes.run_streaming([sys.executable, '-c', CHILD], 30, lines.append,
                                              stop_when=stop_when)
    assert (status, stopped) == (143, True)
    assert lines[4] == 'step 5' and lines[-1] == 'saved'
    assert len(lines) < 20  # Stopped within a few steps, not at the end.
    assert 'step 6' not in asked[:5]
    assert time.monotonic() - start < 20


def test_a_predicate_never_true_lets_the_child_end_on_its_own():
    status, stopped = processes.run_streaming(
        [sys.executable, '-c', 'print("a"); print("b")'], 30, lambda line: None,
        stop_when=lambda line: False)
    assert (status, stopped) == (0, False)
