"""core/progress.py: the progress line's content (count, share, rate, ETA) worked out by hand on
a clock the test moves, its two forms (rewritten in place on a terminal, spaced plain lines
elsewhere), log records over a drawn line, the terminal check on a real pty and a pipe, and
what the fine-tune's runner reads from a child that shows progress (core/processes.py)."""
import io
import logging
import os
import sys

import pytest

from cli_runs import REPO, python_env
from efficientdet_hpu.core import processes
from efficientdet_hpu.core import progress


class Clock:
    """Seconds the test sets."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _plain(total, clock, **kwargs):
    stream = io.StringIO()
    return progress.Progress('evaluating model.ckpt-5', total=total, stream=stream,
                             terminal=False, clock=clock, **kwargs), stream


def _terminal(total, clock, **kwargs):
    stream = io.StringIO()
    return progress.Progress('evaluating model.ckpt-5', total=total, stream=stream,
                             terminal=True, clock=clock, **kwargs), stream


def test_meter_rate_and_eta_by_hand():
    meter = progress.Meter(total=100)
    assert meter.rate(10, 5.0) is None and meter.eta(10, 5.0) is None  # No mark yet.
    meter.mark(10, 5.0)
    assert meter.rate(30, 9.0) == 5.0  # 20 in 4 s.
    assert meter.eta(30, 9.0) == 14.0  # 70 left at 5/s.
    assert progress.Meter().eta(30, 9.0) is None  # No total.


def test_format_seconds():
    assert progress.format_seconds(0) == '0:00:00'
    assert progress.format_seconds(3725.9) == '1:02:05'
    assert progress.format_seconds(-3) == '0:00:00'


def test_line_says_images_done_share_rate_and_eta():
    clock = Clock()
    shown, _ = _plain(2500, clock, note="rank 0's share of 5000")
    clock.now += 20.0
    shown.update(100)  # The first batch (warm-up) starts the rate's clock.
    assert shown.line() == ("evaluating model.ckpt-5: 100/2500 images (4%; rank 0's share "
                            "of 5000)")
    clock.now += 40.0
    shown.update(500)  # 500 images in 40 s: 12.5/s; 1900 left: 152 s.
    assert shown.line() == ("evaluating model.ckpt-5: 600/2500 images (24%; rank 0's share "
                            "of 5000), 12.50 images/s, ETA 0:02:32")
    clock.now += 152.0
    shown.update(1900)
    assert shown.line(final=True) == (  # The rate leaves the first batch's time out.
        "evaluating model.ckpt-5: 2500/2500 images (100%; rank 0's share of 5000) in 0:03:32 "
        "(start-up 0:00:20), 12.50 images/s")
    unknown, _ = _plain(None, clock)
    unknown.update(4)
    clock.now += 2.0
    unknown.update(6)
    assert unknown.line() == 'evaluating model.ckpt-5: 10 images, 3.00 images/s'


def test_plain_lines_at_each_tenth_and_a_last_line_with_the_time():
    clock = Clock()
    shown, stream = _plain(5000, clock)
    for _ in range(1000):  # 5 images every 0.125 s: 40/s, 125 s in all.
        clock.now += 0.125
        shown.update(5)
    shown.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(': ')[1].split(' images')[0] for line in lines] == [
        '%d/5000' % done for done in range(500, 5000, 500)] + ['5000/5000']
    # From the first update's end (5 images at 0.125 s): 495 in 12.375 s; 4500 left.
    assert lines[0] == ('evaluating model.ckpt-5: 500/5000 images (10%), 40.00 images/s, '
                        'ETA 0:01:52')
    assert lines[-1] == ('evaluating model.ckpt-5: 5000/5000 images (100%) in 0:02:05, '
                         '40.00 images/s')


def test_plain_lines_never_flood_a_log():
    clock = Clock()
    quick, stream = _plain(5000, clock)  # All of it in 2 s: no line before the last.
    for _ in range(5000):
        clock.now += 0.0004
        quick.update()
    quick.close()
    assert stream.getvalue().count('\n') == 1
    slow, stream = _plain(None, clock)  # No total: a line every 30 s.
    for _ in range(300):  # 1 image a second for 5 minutes.
        clock.now += 1.0
        slow.update()
    assert stream.getvalue().count('\n') == 10  # At 30, 60, ..., 300 s.
    assert stream.getvalue().splitlines()[0] == 'evaluating model.ckpt-5: 30 images, 1.00 images/s'


def test_the_last_line_comes_when_the_count_is_complete():
    """Not at close: what the loop does after its last batch (closing its input and session)
    is not evaluating images. Without a total, close says the last line."""
    clock = Clock()
    shown, stream = _plain(4, clock)
    shown.update(2)
    clock.now += 1.0
    shown.update(2)
    clock.now += 30.0
    shown.close()
    assert stream.getvalue() == (
        'evaluating model.ckpt-5: 4/4 images (100%) in 0:00:01, 2.00 images/s\n')
    unknown, stream = _plain(None, clock)
    unknown.update(4)
    clock.now += 2.0
    unknown.close()
    assert stream.getvalue() == 'evaluating model.ckpt-5: 4 images in 0:00:02\n'


def test_a_slow_first_batch_gets_a_line_only_after_30_s():
    """The first batch carries the start-up: a tenth it completes is not worth a line
    without a rate (the next one comes soon), but 30 s without news are."""
    clock = Clock()
    shown, stream = _plain(8, clock)
    clock.now += 6.0
    shown.update(2)  # 25% after 6 s.
    assert stream.getvalue() == ''
    slow, stream = _plain(5000, clock)
    clock.now += 31.0
    slow.update(8)
    assert stream.getvalue() == 'evaluating model.ckpt-5: 8/5000 images (0%)\n'


def test_plain_lines_go_to_the_log_when_given():
    clock, logged = Clock(), []
    shown, stream = _plain(10, clock, log=logged.append)
    shown.update(10)
    shown.close()
    assert logged == ['evaluating model.ckpt-5: 10/10 images (100%) in 0:00:00']
    assert stream.getvalue() == ''


def test_terminal_line_is_rewritten_in_place_at_most_twice_a_second():
    clock = Clock()
    shown, stream = _terminal(1000, clock)
    for _ in range(100):  # 10 images every 0.125 s for 12.5 s.
        clock.now += 0.125
        shown.update(10)
    shown.close()
    text = stream.getvalue()
    assert '\n' not in text[:-1] and text.endswith('\x1b[K\n')  # One line, ended at close.
    draws = text.split('\r')[1:]
    assert len(draws) == 26  # Updates 1, 5, 9, ..., 97 (every 0.5 s), then the last line.
    assert draws[0] == 'evaluating model.ckpt-5: 10/1000 images (1%)\x1b[K'
    # Update 21: 200 images in 2.5 s after the first update's; 790 left.
    assert draws[5] == ('evaluating model.ckpt-5: 210/1000 images (21%), 80.00 images/s, '
                        'ETA 0:00:09\x1b[K')
    assert draws[-1] == ('evaluating model.ckpt-5: 1000/1000 images (100%) in 0:00:12, '
                         '80.00 images/s\x1b[K\n')


def test_terminal_line_fits_the_width_without_the_note(monkeypatch):
    """A line longer than the terminal would wrap, and \\r rewrites only its last row."""
    monkeypatch.setenv('COLUMNS', '80')
    clock = Clock()
    shown, stream = _terminal(2500, clock, note="rank 0's share of 5000")
    shown.update(2)
    assert stream.getvalue().split('\r')[-1] == (
        "evaluating model.ckpt-5: 2/2500 images (0%; rank 0's share of 5000)\x1b[K")
    clock.now += 1.0
    shown.update(100)
    assert stream.getvalue().split('\r')[-1] == (
        'evaluating model.ckpt-5: 102/2500 images (4%), 100.00 images/s, ETA 0:00:23\x1b[K')
    monkeypatch.setenv('COLUMNS', '40')
    clock.now += 1.0
    shown.update(100)
    assert stream.getvalue().split('\r')[-1] == (
        'evaluating model.ckpt-5: 202/2500 image\x1b[K')


def test_a_line_written_above_the_terminal_line():
    clock = Clock()
    shown, stream = _terminal(10, clock)
    shown.update(2)
    shown.write('photo.jpg: 640x480, 3 detections')
    clock.now += 0.25
    shown.update(1)  # Drawn again at once, below the line.
    assert stream.getvalue() == ('\revaluating model.ckpt-5: 2/10 images (20%)\x1b[K'
                                 '\r\x1b[Kphoto.jpg: 640x480, 3 detections\n'
                                 '\revaluating model.ckpt-5: 3/10 images (30%), 4.00 images/s, '
                                 'ETA 0:00:01\x1b[K')


def test_a_quiet_loop_shows_nothing_before_its_quiet_seconds():
    clock = Clock()
    quick, stream = _terminal(4, clock, quiet_seconds=5.0)
    for _ in range(4):
        clock.now += 1.0
        quick.update()
    assert stream.getvalue() == ''  # Done in 4 s.
    slow, stream = _plain(10, clock, quiet_seconds=5.0)
    for _ in range(10):
        clock.now += 1.0
        slow.update()
    assert stream.getvalue() == (
        'evaluating model.ckpt-5: 5/10 images (50%), 1.00 images/s, ETA 0:00:05\n'
        'evaluating model.ckpt-5: 10/10 images (100%) in 0:00:10 (start-up 0:00:01), '
        '1.00 images/s\n')


def test_a_log_record_erases_the_drawn_line_and_the_next_update_draws_it_again():
    clock, records = Clock(), io.StringIO()
    handler = logging.StreamHandler(records)
    logging.getLogger().addHandler(handler)
    try:
        shown, stream = _terminal(10, clock)
        shown.update(1)
        logging.getLogger('efficientdet_test').warning('a warning')
        erased = stream.getvalue()
        shown.update(1)  # Within 0.5 s, drawn again all the same.
        shown.close()
    finally:
        logging.getLogger().removeHandler(handler)
    assert erased.endswith('\r\x1b[K') and records.getvalue() == 'a warning\n'
    assert stream.getvalue()[len(erased):].startswith('\revaluating model.ckpt-5: 2/10 images')
    assert not handler.filters  # Taken off at close.


def test_an_error_ends_the_terminal_line_where_it_stood():
    clock = Clock()
    with pytest.raises(ValueError):
        with _terminal(10, clock)[0] as shown:
            shown.update(3)
            raise ValueError('a broken record')
    assert shown.stream.getvalue() == (
        '\revaluating model.ckpt-5: 3/10 images (30%)\x1b[K\n')


def test_a_disabled_progress_shows_nothing():
    clock = Clock()
    shown, stream = _terminal(10, clock, enabled=False)
    shown.update(10)
    shown.write('a line of its own')
    shown.close()
    assert stream.getvalue() == 'a line of its own\n'


def test_terminal_check_on_a_real_pty_and_a_pipe(monkeypatch):
    main, child = os.openpty()
    read, write = os.pipe()
    with os.fdopen(child, 'w') as tty, os.fdopen(write, 'w') as pipe:
        monkeypatch.setenv('TERM', 'xterm')
        assert progress.is_terminal(tty) and not progress.is_terminal(pipe)
        monkeypatch.setenv('TERM', 'dumb')
        assert not progress.is_terminal(tty)
    os.close(main)
    os.close(read)
    assert not progress.is_terminal(io.StringIO())


CHILD = '''
import sys
from efficientdet_hpu.core import progress
clock = [0.0]
shown = progress.Progress('evaluating model.ckpt-9', total=3000, clock=lambda: clock[0])
for _ in range(750):  # 4 images every 0.25 s (16/s) for 187.5 s, on the clock above.
    clock[0] += 0.25
    shown.update(4)
shown.close()
'''


def test_the_runners_pipe_gets_spaced_whole_lines():
    """The fine-tune's runner reads its children's output line by line from a pipe
    (core/processes.run_streaming, which turns carriage returns into line ends): a child's
    evaluation progress reaches it as plain lines, about one per tenth."""
    lines = []
    status, _ = processes.run_streaming([sys.executable, '-c', CHILD], 120, lines.append,
                                        env=python_env(), cwd=REPO)
    assert status == 0, lines
    assert len(lines) == 10 and all('\x1b' not in line for line in lines), lines
    assert lines[0] == ('evaluating model.ckpt-9: 300/3000 images (10%), 16.00 images/s, '
                        'ETA 0:02:48')
    assert lines[-1] == ('evaluating model.ckpt-9: 3000/3000 images (100%) in 0:03:07, '
                         '16.00 images/s')
