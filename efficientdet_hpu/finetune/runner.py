"""The fine-tune's files under --output_dir and how it runs the project's commands: each as a
child process under a deadline (core/processes.py), its output in logs/<name>.log, shown
as it comes when asked; a child's one-line user error becomes the fine-tune's own.

Children run the library by module name (`python -m efficientdet_hpu.cli.main`) with this
package's parent first on PYTHONPATH, so a checkout runs its own code wherever the command
is started from, and an installed package its installed code.
"""
import collections
import dataclasses
import os
import subprocess
import sys
import time

from efficientdet_hpu.core import compat
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import processes
from efficientdet_hpu.core.errors import UserError

MODULES = {
    'convert': 'efficientdet_hpu.datatools.create_coco_tfrecord',
    'doctor': 'efficientdet_hpu.datatools.doctor',
    'train': 'efficientdet_hpu.cli.main',
    'inference': 'efficientdet_hpu.cli.inference',
    'analyze': 'efficientdet_hpu.cli.analyze',
}
TAIL_LINES = 40
# A stop signal (cli/finetune.py): main.py checkpoints the step it is at and exits.
STOP_GRACE_SECONDS = 120


class StageFailed(RuntimeError):
    """A command of a stage failed in a way that is not the input's fault (a bug, a crash,
    a deadline); the message names it, its exit status and its log."""


class ChildUserError(UserError):
    """A command of a stage stopped on a user or data error: its own one line."""


def exit_status(program, work, output_dir, verbose):
    """Runs `work()` as efficientdet-finetune and efficientdet-review run their stages and
    returns the command's exit status. SIGTERM, SIGINT and SIGHUP reach the running command
    (main.py: at its step, with its checkpoint), which ends cleanly: then one line and 128+N
    (processes.stops_forwarded). A user error or a full disk under `output_dir`: one line,
    2; a stage that failed otherwise: one line, 1."""
    try:
        with processes.stops_forwarded(program, STOP_GRACE_SECONDS):
            work()
    except processes.Stopped as stop:
        print(stop.line(program), file=sys.stderr, flush=True)
        return stop.exit_status
    except UserError as error:
        return errors.fail(program, error, verbose)
    except StageFailed as error:
        print('%s: %s' % (program, error), file=sys.stderr, flush=True)
        return 1
    except OSError as error:
        message = errors.disk_full_message(error, output_dir)
        if message is None:
            raise
        return errors.fail(program, message, verbose)
    return 0


@dataclasses.dataclass(frozen=True)
class Layout:
    """Paths under --output_dir."""
    root: str

    def path(self, *parts) -> str:
        return os.path.join(self.root, *parts)

    data = property(lambda self: self.path('data'))
    train_json = property(lambda self: self.path('data', 'train.json'))
    val_json = property(lambda self: self.path('data', 'val.json'))
    inputs_json = property(lambda self: self.path('data', 'inputs.json'))
    val_photos = property(lambda self: self.path('data', 'val_photos'))
    doctor_input = property(lambda self: self.path('data', 'doctor-input.json'))
    doctor_json = property(lambda self: self.path('data', 'doctor.json'))
    records = property(lambda self: self.path('data', 'records'))
    request_json = property(lambda self: self.path('request.json'))
    plan_yaml = property(lambda self: self.path('plan.yaml'))
    plan_json = property(lambda self: self.path('plan.json'))
    model_dir = property(lambda self: self.path('model'))
    training_json = property(lambda self: self.path('training.json'))
    steps_file = property(lambda self: self.path('steps.json'))  # main.py --steps_file.
    evaluation = property(lambda self: self.path('evaluation'))
    analysis = property(lambda self: self.path('evaluation', 'analysis'))
    flipped = property(lambda self: self.path('evaluation', 'flipped'))  # predict --tta.
    picture = property(lambda self: self.path('detections.png'))
    export = property(lambda self: self.path('export'))
    summary_json = property(lambda self: self.path('summary.json'))
    logs = property(lambda self: self.path('logs'))


def child_env(verbose=False) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join(
        [compat.PACKAGE_PARENT] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    if not verbose:
        env.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    return env


def error_line(lines):
    """The child's `PROGRAM: error: ...` line, or None."""
    found = [line for line in lines if ': error: ' in line]
    return found[-1].strip() if found else None


class Runner:
    """Runs the stages' commands; `say` prints a line of the fine-tune's own."""

    def __init__(self, layout, verbose=False, stream=sys.stdout):
        self.layout, self.verbose, self.stream = layout, verbose, stream
        self.started = time.monotonic()
        self.stage = None  # (number, name) of the stage running, for the line at a stop.

    def say(self, text=''):
        print(text, file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def command(self, name, kind, args, timeout, echo=False, stop_after=None, stop_when=None):
        """Runs `python -m MODULES[kind] args...`; returns (status, stopped by stop_after or
        by stop_when, a function of each line: processes.run_streaming). A stop sent once the
        command had done its work (exit status 0: main.py past its last step) stopped nothing:
        stopped is False then (a stopped main.py exits non-zero, its checkpoint written).
        A status 2 with a one-line error raises ChildUserError, any other failure but the
        stop StageFailed (both name logs/<name>.log); a stop signal processes.Stopped, once
        the command has ended (cli/finetune.py's processes.stops_forwarded)."""
        os.makedirs(self.layout.logs, exist_ok=True)
        log_path = os.path.join(self.layout.logs, name + '.log')
        command = [sys.executable, '-m', MODULES[kind]] + [str(a) for a in args]
        tail = collections.deque(maxlen=TAIL_LINES)
        with open(log_path, 'a', encoding='utf-8') as log:
            log.write('$ %s\n' % ' '.join(command))

            def on_line(line):
                tail.append(line)
                log.write(line + '\n')
                log.flush()
                if echo or self.verbose:
                    self.say('    ' + line)
            try:
                status, stopped = processes.run_streaming(
                    command, timeout, on_line, env=child_env(self.verbose), stop_after=stop_after,
                    stop_when=stop_when)
            except subprocess.TimeoutExpired:
                raise StageFailed('%s did not end within its deadline of %.0f min and was '
                                  'stopped; its output: %s' % (name, timeout / 60.0,
                                                               log_path)) from None
        if status == 0 or stopped:
            return status, stopped and status != 0
        line = error_line(tail)
        if status == 2 and line:
            raise ChildUserError(line)
        raise StageFailed('%s failed (exit status %d)%s; its output: %s' % (
            name, status, ': ' + line if line else '', log_path))
