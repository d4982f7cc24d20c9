"""`main.py --mode=eval` shows its progress as a user sees it: into a pipe (a log, the fine-tune's
runner, mpirun) as whole lines, and on a real terminal (a pty) as one line rewritten in place,
with the log's lines and the COCO table around it."""
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from cli_runs import REPO, python_env, run_main, started, tiny_flags

pytestmark = pytest.mark.slow  # main.py processes.

# The tiny data set's 8 validation images, the run's last checkpoint; the rate leaves the
# start-up (to the first batch) out.
LAST = (r'evaluating model\.ckpt-2: 8/8 images \(100%\) in 0:\d\d:\d\d'
        r'( \(start-up 0:\d\d:\d\d\))?, [\d.]+ images/s')


def _eval_flags(tiny_dataset, model_dir):
    return tiny_flags(tiny_dataset, model_dir, '--mode=eval', '--num_epochs=1',
                      '--eval_timeout=1', '--min_eval_interval=0')


def _copy(tiny_trained_run, tmp_path, name):
    model_dir = str(tmp_path / name)
    shutil.copytree(tiny_trained_run, model_dir)
    return model_dir


def test_eval_into_a_pipe_prints_whole_progress_lines(tiny_dataset, tiny_trained_run, tmp_path):
    result = run_main(_eval_flags(tiny_dataset, _copy(tiny_trained_run, tmp_path, 'piped')))
    assert result.returncode == 0, result.stdout[-5000:]
    assert '\r' not in result.stdout and '\x1b' not in result.stdout
    lines = result.stdout.splitlines()
    shown = [line for line in lines if ' evaluating model.ckpt-2: ' in line]
    assert shown and re.search(LAST + '$', shown[-1]), shown
    for line in shown[:-1]:  # Another tenth after 5 s (or 30 s); from the second batch on
        # with the rate since the first (the first carries the warm-up).
        assert re.search(r'evaluating model\.ckpt-2: \d/8 images \(\d+%\)(, [\d.]+ images/s, '
                         r'ETA 0:\d\d:\d\d)?$', line), line
    order = [next(i for i, line in enumerate(lines) if text in line) for text in (
        'evaluating model.ckpt-2 (step 2)', 'evaluating model.ckpt-2: 8/8', 'scoring ',
        'COCO evaluation of model.ckpt-2 (step 2, 8 images):')]
    assert order == sorted(order), lines


def _run_on_a_pty(command, timeout):
    """(exit status, everything written) of `command` with its stdout and stderr a new
    pseudo-terminal, read until it ends; killed past `timeout` seconds."""
    main, child = os.openpty()
    chunks, deadline = [], time.monotonic() + timeout
    try:
        with started(command, env=python_env({'TERM': 'xterm', 'COLUMNS': '200'}),
                     stdout=child, stderr=child) as process:
            os.close(child)
            child = None
            while time.monotonic() < deadline:
                ready, _, _ = select.select([main], [], [], 1.0)
                if not ready:
                    continue
                try:
                    data = os.read(main, 65536)
                except OSError:  # EIO: every writer of the pty is gone.
                    break
                if not data:
                    break
                chunks.append(data)
            status = process.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail('main.py on a pty did not end within %d s:\n%s' % (
            timeout, b''.join(chunks).decode(errors='replace')[-3000:]))
    finally:
        os.close(main)
        if child is not None:
            os.close(child)
    # The terminal turns each line end into \r\n (onlcr); back to what the program wrote.
    return status, b''.join(chunks).decode(errors='replace').replace('\r\n', '\n')


def test_eval_on_a_terminal_rewrites_one_line(tiny_dataset, tiny_trained_run, tmp_path):
    model_dir = _copy(tiny_trained_run, tmp_path, 'terminal')
    status, text = _run_on_a_pty([sys.executable, os.path.join(REPO, 'main.py')] +
                                 _eval_flags(tiny_dataset, model_dir), timeout=600)
    assert status == 0, text[-5000:]
    draws = [part for part in text.split('\r') if part.startswith('evaluating model.ckpt-2: ')]
    assert draws[0].startswith('evaluating model.ckpt-2: 2/8 images (25%)\x1b[K'), draws
    for draw in draws[1:-1]:  # Each rewrites the line: no line end of its own.
        assert re.fullmatch(r'evaluating model\.ckpt-2: \d/8 images \(\d+%\), [\d.]+ images/s, '
                            r'ETA 0:\d\d:\d\d\x1b\[K', draw), draw
    assert re.match(LAST + r'\x1b\[K\n', draws[-1]), draws[-1]  # Ended, then the log goes on.
    assert 'COCO evaluation of model.ckpt-2 (step 2, 8 images):' in text
    assert not re.search(r'\d\d:\d\d:\d\d evaluating model\.ckpt-2: ', text)  # Not logged.
