"""Worker processes the code owns: every way they can fail ends the run within seconds.

multiprocessing.Pool shares one task queue among its workers behind a lock: a worker that dies
while holding it (a crash, the out-of-memory killer, a terminate() at the wrong moment) leaves
Pool.terminate() waiting on that lock forever. That is how the dataset converter once hung for
35 minutes after a bad image instead of printing its one error line.

Here each worker has a pipe of its own and is handed its next job only when it reports the
last one: no lock is shared between processes, so none can be left held. The parent waits on
the pipes and on the processes' exit sentinels at once, with a time-out, and ends the run:
- on the first error a job raises: the other workers are stopped (SIGTERM, SIGKILL after
  STOP_SECONDS) and that error is raised again in the parent, with the worker's traceback
  chained for --verbose;
- when a worker exits without answering (killed, crashed): WorkerFailure naming its exit;
- when no worker has finished a job or reported progress (tick()) for `stall_seconds`:
  WorkerFailure naming the stall.
Workers are started with 'spawn': a forked child of a process that already runs TensorFlow can
hang. So `function` and the jobs must be picklable and the calling script needs the
`if __name__ == '__main__':` guard.
"""
import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import time
import traceback
from typing import Callable, Iterable, Iterator, Optional

from efficientdet_hpu.core.errors import UserError

STOP_SECONDS = 3.0  # From SIGTERM to SIGKILL, and then again to give up waiting.
STALL_SECONDS = 900.0  # No job finished and no tick() for this long: the run is stuck.
POLL_SECONDS = 0.25  # How often on_progress is called while the workers run.

_progress = None  # This process's progress counter: a RawValue in a worker, else _LocalCount.


class WorkerFailure(UserError, RuntimeError):
    """A worker process died or stalled; the message says which and what to try."""


class WorkerTraceback(Exception):
    """The traceback of an error raised in a worker, chained to the error raised again."""


class _LocalCount:
    """tick()'s counter when the jobs run in this process: calls on_progress itself."""

    def __init__(self, on_progress):
        self.value, self._on_progress = 0, on_progress

    def add(self, count):
        self.value += count
        if self._on_progress is not None:
            self._on_progress(self.value)


def tick(count: int = 1) -> None:
    """Reports progress inside a job (an image written, a record checked): what on_progress
    sums, and what keeps a long job from counting as stalled."""
    if isinstance(_progress, _LocalCount):
        _progress.add(count)
    elif _progress is not None:
        _progress.value += count  # A RawValue written by this worker only: no lock needed.


def run_unordered(function: Callable, jobs: Iterable, num_workers: int,
                  initializer: Optional[Callable] = None, initargs: tuple = (),
                  on_progress: Optional[Callable[[int], None]] = None,
                  stall_seconds: float = STALL_SECONDS, name: str = 'worker') -> Iterator:
    """Yields function(job) for every job, in the order they finish.

    num_workers 1 runs the jobs in this process. Otherwise up to num_workers spawned processes
    (each runs initializer(*initargs) once) take the jobs one at a time. on_progress(total)
    gets the sum of tick() counts of all jobs so far. Closing the generator early, or any
    error, stops every worker before it returns or raises.
    """
    global _progress
    jobs = list(jobs)
    if num_workers <= 1 or len(jobs) <= 1:
        _progress = _LocalCount(on_progress)
        try:
            if initializer is not None:
                initializer(*initargs)
            for job in jobs:
                yield function(job)
        finally:
            _progress = None
        return
    workers = _start(min(num_workers, len(jobs)), function, initializer, initargs, name)
    try:
        yield from _Scheduler(workers, jobs, on_progress, stall_seconds, name).results()
    finally:
        stop(workers)


@dataclasses.dataclass
class _Worker:
    process: multiprocessing.Process
    connection: multiprocessing.connection.Connection
    progress: object  # RawValue('q') the worker alone writes.
    job: Optional[int] = None  # Index of the job it holds, None when idle.


def _start(count, function, initializer, initargs, name):
    context = multiprocessing.get_context('spawn')
    workers = []
    for number in range(count):
        parent_end, child_end = context.Pipe()
        progress = context.RawValue('q', 0)
        process = context.Process(target=_worker_main, name='%s %d' % (name, number + 1),
                                  args=(child_end, function, initializer, initargs, progress),
                                  daemon=True)
        process.start()
        child_end.close()
        workers.append(_Worker(process, parent_end, progress))
    return workers


def stop(workers) -> None:
    """Stops every worker: SIGTERM, then SIGKILL after STOP_SECONDS; each join has a deadline."""
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(STOP_SECONDS)
        worker.connection.close()


class _Scheduler:
    """Hands jobs to idle workers and reads their answers; see the module docstring."""

    def __init__(self, workers, jobs, on_progress, stall_seconds, name):
        self.workers, self.name = workers, name
        self.pending, self.total = collections.deque(enumerate(jobs)), len(jobs)
        self.on_progress, self.stall_seconds = on_progress, stall_seconds
        self.last_progress, self.last_change = -1, time.monotonic()

    def results(self):
        for worker in self.workers:
            self._hand_out(worker)
        while any(worker.job is not None for worker in self.workers):
            busy = [worker for worker in self.workers if worker.job is not None]
            ready = multiprocessing.connection.wait(
                [worker.connection for worker in busy] +
                [worker.process.sentinel for worker in busy], POLL_SECONDS)
            for worker in busy:
                if worker.connection in ready or worker.process.sentinel in ready:
                    value = self._answer(worker)
                    self.last_change = time.monotonic()
                    yield value
                    self._hand_out(worker)
            self._watch_progress()
        for worker in self.workers:
            _send(worker, None)  # Done: the worker returns.
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))

    def _hand_out(self, worker):
        if self.pending:
            worker.job, job = self.pending[0][0], self.pending.popleft()
            if not _send(worker, job):
                raise self._died(worker)

    def _answer(self, worker):
        """The job's value, or raises its error / WorkerFailure when the worker is gone."""
        try:
            kind, value = worker.connection.recv()
        except (EOFError, OSError):
            raise self._died(worker) from None
        worker.job = None
        if kind == 'error':
            error, text = value
            raise error from WorkerTraceback(text)
        return value

    def _died(self, worker):
        worker.process.join(STOP_SECONDS)
        code = worker.process.exitcode
        how = ('was killed by %s' % signal.Signals(-code).name if code is not None and code < 0
               else 'exited with status %s' % code)
        hint = (' (SIGKILL is often the out-of-memory killer: use fewer worker processes)'
                if code == -signal.SIGKILL else '')
        return WorkerFailure('%s (pid %s) %s while working on job %d of %d%s'
                             % (worker.process.name, worker.process.pid, how,
                                worker.job + 1, self.total, hint))

    def _watch_progress(self):
        total = sum(worker.progress.value for worker in self.workers)
        now = time.monotonic()
        if total != self.last_progress:
            self.last_progress, self.last_change = total, now
            if self.on_progress is not None:
                self.on_progress(total)
        elif now - self.last_change > self.stall_seconds:
            jobs = sorted(worker.job + 1 for worker in self.workers if worker.job is not None)
            raise WorkerFailure('no %s process finished a job or reported progress in %.0f s '
                                '(jobs %s still running): stuck on a file system or a device? '
                                'Its stack: py-spy dump --pid PID' % (
                                    self.name, self.stall_seconds, jobs))


def _send(worker, job) -> bool:
    try:
        worker.connection.send(job)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
        return False


def _worker_main(connection, function, initializer, initargs, progress):
    """A worker's loop: (index, job) in, ('value', value) or ('error', (error, text)) out."""
    global _progress
    _progress = progress
    failed_start = None
    try:
        if initializer is not None:
            initializer(*initargs)
    except Exception as error:  # pylint: disable=broad-except
        failed_start = ('error', (_portable(error), traceback.format_exc()))
    try:
        while True:
            message = connection.recv()
            if message is None:
                return
            _, job = message
            try:
                answer = failed_start or ('value', function(job))
            except Exception as error:  # pylint: disable=broad-except
                answer = ('error', (_portable(error), traceback.format_exc()))
            connection.send(answer)
            if answer[0] == 'error':
                return
    except (EOFError, OSError, KeyboardInterrupt):
        return


def _portable(error):
    """`error` when it survives pickling (it is raised again in the parent), else a
    RuntimeError carrying its type and text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # pylint: disable=broad-except
        return RuntimeError('%s: %s' % (type(error).__name__, error))
