"""Jobs for tests/core/test_worker_pool.py, importable by the spawned workers (plain functions, no
TensorFlow). A job is a tuple (what, argument)."""
import os
import signal
import time

from efficientdet_hpu.core import worker_pool


class Unpicklable(Exception):
    def __init__(self, message, handle):
        super().__init__(message)
        self.handle = handle


class DataProblem(worker_pool.UserError):
    """A user error raised in a worker: the parent must raise this type again."""


def run(job):
    what, argument = job
    if what == 'square':
        for _ in range(argument):
            worker_pool.tick()
        return argument * argument
    if what == 'pid':
        return os.getpid()
    if what == 'sleep':
        # Says it started, and where: whole once it exists (a rename), as a job that waits for
        # it may have the pool stop this worker at once.
        partial = os.path.join(os.path.dirname(argument), '.partial-' + os.path.basename(argument))
        with open(partial, 'w', encoding='utf-8') as stream:
            stream.write(str(os.getpid()))
        os.replace(partial, argument)
        time.sleep(120)
    if what == 'fail':
        image, started = argument
        _wait_for(started)
        raise DataProblem('image %r is truncated; re-export it' % image)
    if what == 'die':
        _wait_for(argument)
        os.kill(os.getpid(), signal.SIGKILL)
    if what == 'unpicklable':
        raise Unpicklable('cannot travel', handle=lambda: None)
    raise ValueError('unknown job %r' % what)


def failing_initializer():
    raise RuntimeError('the worker could not start')


def _wait_for(path, seconds=60):
    """Until the sleeping job has started (its file exists): the failure then meets a busy
    worker, whatever the order the workers started in."""
    end = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
