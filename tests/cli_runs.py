"""The checkout's commands run as a user runs them (main.py, inference.py, bench.py, python -m
...), the flags of the tiny recipe they train, and the check of a user error's output.

Plain functions imported by the test modules; fixtures live in conftest.py.
"""
import contextlib
import os
import signal
import subprocess
import sys
import time

from efficientdet_hpu.core import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A model small enough to build and step in seconds on 2 cores, same code paths as D0.
TINY_HPARAMS = ('image_size=128,min_level=3,max_level=5,fpn_num_filters=16,'
                'fpn_cell_repeats=1,box_class_repeats=1,jitter_min=0.9,jitter_max=1.1')


def run_process(command, timeout, env=None, cwd=REPO, stdin=subprocess.DEVNULL,
                stderr=subprocess.STDOUT, input=None):  # pylint: disable=redefined-builtin
    """Runs `command` (a list) under a deadline (core/processes.py): past `timeout` seconds
    its whole session is killed and subprocess.TimeoutExpired raised with the output so
    far. Returns CompletedProcess (text; stderr merged into stdout unless
    stderr=subprocess.PIPE)."""
    return processes.run(command, timeout, cwd=cwd, env=env, stdin=stdin, stderr=stderr,
                         input=input)


@contextlib.contextmanager
def started(command, env=None, cwd=REPO, stdin=subprocess.DEVNULL, stdout=None, stderr=None,
            wait_seconds=30):
    """Popen of `command` (text mode) in a session of its own, for a test that signals or
    watches a running process; on leaving the block every process of its session is killed and
    the process reaped within `wait_seconds`."""
    process = subprocess.Popen(list(command), cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                               stderr=stderr, text=True, start_new_session=True)
    try:
        yield process
    finally:
        kill_group(process)
        try:
            process.wait(wait_seconds)
        finally:
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()


@contextlib.contextmanager
def tmpfs_disk(path, size):
    """A tmpfs of `size` (mount's size=, e.g. '4m') mounted at the new directory `path` for the
    block: a disk that fills up. Unmounted after, whatever the block raised."""
    os.makedirs(path)
    mounted = run_process(['mount', '-t', 'tmpfs', '-o', 'size=%s' % size, 'tmpfs', str(path)],
                          timeout=60)
    assert mounted.returncode == 0, mounted.stdout
    try:
        yield path
    finally:
        run_process(['umount', '-l', str(path)], timeout=60)


def signalled(process, signals, gap, wait_seconds, pids, settle_seconds=10):
    """Sends `signals` to `process` (started by `started`), `gap` seconds apart, and waits for
    it; returns (its exit status, seconds from the first signal to its end, those of `pids`
    still running `settle_seconds` later). Then every process of `pids` (recorded while it ran:
    children in sessions of their own, which leaving `started` does not reach) is killed,
    whether the test passes or not."""
    try:
        start = time.monotonic()
        for index, signum in enumerate(signals):
            if index:
                time.sleep(gap)
            process.send_signal(signum)
        status = process.wait(wait_seconds)
        seconds = time.monotonic() - start
        return status, seconds, still_running(pids, settle_seconds)
    finally:
        for pid in pids:
            processes.kill_tree(pid)


def stops_end_the_commands():
    """A test run stopped by SIGTERM or SIGHUP (a CI's deadline, `kill`, a closed terminal)
    takes what its tests started with it: each command runs in a session of its own (above),
    which a signal to pytest or its process group does not reach. The signal's handler kills
    every process below this one (xdist's workers, the commands and their sessions), then ends
    this process by the same signal. Ctrl-C needs none: KeyboardInterrupt unwinds through the
    commands' waits, which kill them on leaving."""
    def on_stop(signum, _frame):
        processes.kill_descendants()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) == signal.SIG_DFL:
            signal.signal(number, on_stop)


def still_running(pids, seconds):
    """Those of `pids` that have not ended (a zombie has) within `seconds`."""
    end = time.monotonic() + seconds
    while True:
        running = processes.process_table()
        left = [pid for pid in pids if pid in running]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.05)


def kill_group(process):
    """SIGKILLs every process of the session of `process` (started by `started`): mpirun's
    ranks too, which Open MPI puts in process groups of their own."""
    processes.kill_session(process.pid)


def python_env(env=None):
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', TF_CPP_MIN_LOG_LEVEL='2')
    full_env.update(env or {})
    return full_env


def run_python(args, timeout=600, env=None, cwd=REPO):
    """Runs `python args...` with the test interpreter under run_process's deadline."""
    return run_process([sys.executable] + list(args), timeout, env=python_env(env), cwd=cwd)


def run_main(flags, timeout=600, env=None):
    return run_python(['main.py'] + list(flags), timeout=timeout, env=env)


def tiny_flags(dataset, model_dir, *extra, hparams=TINY_HPARAMS):
    """main.py flags of a 2-step-per-epoch tiny run on `dataset` (the tiny_dataset fixture)."""
    return ['--model_dir=%s' % model_dir, '--hparams=%s' % hparams,
            '--training_file_pattern=%s' % dataset['train_pattern'],
            '--validation_file_pattern=%s' % dataset['val_pattern'],
            '--val_json_file=%s' % dataset['val_json'],
            '--train_batch_size=2', '--eval_batch_size=2', '--num_examples_per_epoch=4',
            '--log_every_n_steps=1', '--cp_every_n_steps=100'] + list(extra)


# Two ranks, 2 images each (global batch 4), 8 images an epoch (2 steps), 4 epochs: 8 steps.
TWO_RANK_EPOCHS = 4


def two_rank_flags(dataset, model_dir, *extra):
    """The flags of two_rank_run (after demo_efficientdet.py --use_horovod 2): a seeded,
    ordered run, so that a stopped and resumed run with the same flags ends with its weights."""
    return tiny_flags(dataset, str(model_dir), '--mode=train', '--deterministic',
                      '--num_examples_per_epoch=8', '--num_epochs=%d' % TWO_RANK_EPOCHS, *extra)


def assert_one_line_error(result, *expected, starts_with=None):
    """Asserts that a finished command failed as a user mistake must (core/errors.py): exit status
    2, exactly one line holding 'error:' in its output, no traceback. That line must begin
    with `starts_with` (when given) and contain every string of `expected`. Reads stdout and
    stderr both (run_python merges them into stdout). Returns the error line."""
    output = (result.stdout or '') + (result.stderr or '')
    assert result.returncode == 2, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    errors = [line for line in output.splitlines() if 'error:' in line]
    assert len(errors) == 1, output[-3000:]
    (line,) = errors
    assert starts_with is None or line.startswith(starts_with), (starts_with, line)
    missing = [part for part in expected if part not in line]
    assert not missing, (missing, line)
    return line
