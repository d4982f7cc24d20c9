"""`efficientdet_hpu.train(...)`: main.py from Python, returning the run's summary.

    import efficientdet_hpu
    run = efficientdet_hpu.train(model_dir='runs/mine', mode='train_and_eval',
                                 training_file_pattern='data/train-*.tfrecord', ...)
    print(run.step, run.metrics['AP'], run.checkpoint)
    detector = run.detector()

Each keyword is the main.py flag of that name (`train_batch_size=8` is --train_batch_size=8;
True/False for a boolean, a dict or a list for --hparams). The run is main.py itself, started
as a child process (`python -m efficientdet_hpu.cli.main`): flags, absl and TensorFlow state
start clean each time, and the caller's process neither holds the training graph nor has its
own flags parsed. Its output is shown as it comes. One process: many cards are launched with
demo_efficientdet.py (docs/launching.md).

Stopping: `time_limit` seconds after the start main.py is sent SIGTERM and saves a checkpoint
of the step it reached (engine/preemption.py), as on a cluster's preemption; Ctrl-C does the
same (SIGINT passed on: core/processes.stops_forwarded) and raises KeyboardInterrupt once the
child has ended (a second Ctrl-C kills it); a SIGTERM or SIGHUP to the calling process stops
main.py alike and raises processes.Stopped (exit status 128+N). Signals can only be caught on
the main thread: called from another thread, train() leaves them to the caller.
"""
import collections
import dataclasses
import json
import os
import subprocess
import signal
import sys
import threading
import time
import typing

from efficientdet_hpu.core import tf_env  # noqa: F401  (before anything imports tensorflow)
from efficientdet_hpu.core import processes
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.engine import train_log
from efficientdet_hpu.finetune import runner
from efficientdet_hpu.serving import python_api

MODULE = 'efficientdet_hpu.cli.main'
STOP_GRACE_SECONDS = processes.STOP_GRACE_SECONDS  # After the stop signal: checkpoint, exit.
TAIL_LINES = 40


class TrainingError(UserError):
    """main.py stopped on a user or data error: its own one line (`main.py: error: ...`)."""


class TrainingFailed(RuntimeError):
    """main.py failed in a way that is not the input's fault; the message has its last lines."""


@dataclasses.dataclass
class TrainingRun:
    """What a train() call left in model_dir.

    step: the newest checkpoint's global step (None: no checkpoint); checkpoint: its prefix;
    metrics: the latest evaluation's COCO metrics ({'AP': ..., 'AP50': ...}, from
    model_dir/eval/metrics_latest.json; None without an evaluation) and metrics_step its step;
    best_checkpoint / best_metrics: model_dir/best (evaluation keeps the best AP there);
    last_log: the last training record of model_dir/train_log.jsonl (loss, images_per_sec);
    stopped: ended by time_limit (a checkpoint of the step reached is kept); output: main.py's
    last lines; seconds: wall time of the call.
    """
    model_dir: str
    exit_status: int
    stopped: bool
    seconds: float
    step: typing.Optional[int] = None
    checkpoint: typing.Optional[str] = None
    metrics: typing.Optional[dict] = None
    metrics_step: typing.Optional[int] = None
    best_checkpoint: typing.Optional[str] = None
    best_metrics: typing.Optional[dict] = None
    last_log: typing.Optional[dict] = None
    output: typing.List[str] = dataclasses.field(default_factory=list, repr=False)

    def detector(self, checkpoint='latest'):
        """A Detector of this run ('latest' or 'best' checkpoint, a step or a prefix)."""
        return python_api.Detector(self.model_dir, checkpoint=checkpoint)


def flag_arguments(values):
    """{'train_batch_size': 8, 'use_amp': True, 'hparams': {'image_size': 128}} ->
    ['--train_batch_size=8', '--use_amp=true', '--hparams=image_size=128']; None is left out."""
    arguments = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = 'true' if value else 'false'
        elif isinstance(value, dict):
            text = ','.join('%s=%s' % item for item in value.items())
        elif isinstance(value, (list, tuple)):
            text = ','.join(str(item) for item in value)
        else:
            text = str(value)
        arguments.append('--%s=%s' % (name, text))
    return arguments


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def summary(model_dir, exit_status=0, stopped=False, seconds=0.0, output=()):
    """The TrainingRun of model_dir as its files say now."""
    run = TrainingRun(os.fspath(model_dir), exit_status, stopped, seconds, output=list(output))
    run.checkpoint = checkpoints.latest_checkpoint(run.model_dir)
    if run.checkpoint:
        run.step = checkpoints.checkpoint_step(run.checkpoint)
    latest = _read_json(os.path.join(run.model_dir, 'eval', 'metrics_latest.json'))
    if latest:
        run.metrics, run.metrics_step = latest['metrics'], latest['step']
    best = _read_json(os.path.join(run.model_dir, 'best', 'best_eval.json'))
    if best:
        run.best_checkpoint = os.path.join(run.model_dir, 'best', best['checkpoint'])
        run.best_metrics = best['metrics']
    records = [r for r in train_log.read_json_log(run.model_dir) if r.get('event') == 'train']
    run.last_log = records[-1] if records else None
    return run


def _run_main(command, timeout, on_line, verbose, time_limit):
    """processes.run_streaming, with stop signals passed on to main.py on the main thread."""
    def run():
        return processes.run_streaming(command, timeout, on_line, env=runner.child_env(verbose),
                                       stop_after=time_limit)
    if threading.current_thread() is not threading.main_thread():
        return run()
    with processes.stops_forwarded('efficientdet_hpu.train', STOP_GRACE_SECONDS,
                                   announce='passed on to main.py, which saves a checkpoint of '
                                   'its step'):
        return run()


def train(model_dir, mode='train', time_limit=None, quiet=False, on_line=None, verbose=False,
          **flags):
    """Runs `python main.py --model_dir=... --mode=... --FLAG=VALUE...`; returns its
    TrainingRun. time_limit: seconds before it is asked to checkpoint and stop (None: no
    limit); quiet: do not print its output (TrainingRun.output keeps the last lines);
    on_line: called with each line of it as it comes (a log file, a notebook widget);
    verbose: main.py --verbose. Raises TrainingError with main.py's one line on a user error
    (a flag typo, missing data), TrainingFailed on anything else."""
    command = [sys.executable, '-m', MODULE] + flag_arguments(
        dict(model_dir=os.fspath(model_dir), mode=mode, verbose=verbose or None, **flags))
    tail = collections.deque(maxlen=TAIL_LINES)

    def take(line):
        tail.append(line)
        if not quiet:
            print(line, flush=True)
        if on_line is not None:
            on_line(line)
    start = time.monotonic()
    timeout = float('inf') if time_limit is None else time_limit + STOP_GRACE_SECONDS
    try:
        status, stopped = _run_main(command, timeout, take, verbose, time_limit)
    except processes.Stopped as stop:  # main.py has checkpointed its step and ended.
        if stop.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise
    except subprocess.TimeoutExpired:
        raise TrainingFailed('main.py did not stop within %d s of the stop signal sent at '
                             'time_limit=%s s and was killed; its last lines:\n%s'
                             % (STOP_GRACE_SECONDS, time_limit, '\n'.join(tail))) from None
    if status != 0 and not stopped:
        line = runner.error_line(tail)
        if status == 2 and line:
            raise TrainingError(line)
        raise TrainingFailed('main.py failed (exit status %d); its last lines:\n%s'
                             % (status, '\n'.join(tail)))
    return summary(model_dir, status, stopped, time.monotonic() - start, tail)
