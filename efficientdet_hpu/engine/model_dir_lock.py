"""One training job per model_dir: model_dir/.lock, held by rank 0 of the job that trains there.

The lock file is JSON naming its holder (host, pid, start time, the kernel's boot id and the
process's start tick, so a recycled pid is not mistaken for the holder). It is created whole
with a hard link (atomic, also on NFS), refreshed every HEARTBEAT_SECONDS by a thread of the
holder (its mtime), and removed when the holder ends, also at an error or a stop signal. A lock
found in place is the live job's when:
- its holder runs on this host (same host name and boot): that pid is alive and started when
  the lock says;
- its holder runs on another host: the lock was refreshed within STALE_SECONDS.
Otherwise the job is gone (killed, its node lost) and the lock is taken over with a warning.
Evaluation (`--mode=eval`) takes no lock: an evaluator beside the training job is a
documented use. Plain Python, no TensorFlow.
"""
import contextlib
import json
import os
import socket
import threading
import time
import uuid

from absl import logging

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.errors import UserError

LOCK_NAME = '.lock'
HEARTBEAT_SECONDS = 30
STALE_SECONDS = 300  # 10 missed refreshes: the holder on another host is gone.
JOIN_SECONDS = 10  # The refresher wakes at once when stopped; an utime on a hung NFS may not.
THREAD_NAME = 'efficientdet:model_dir-lock'  # tests/conftest.py: no such thread outlives a test.


class ModelDirLockedError(UserError, RuntimeError):
    """Another live job trains in this model_dir; the message names it."""


def _read(path):
    try:
        with open(path, encoding='utf-8') as stream:
            return stream.read()
    except OSError:
        return None


def _boot_id():
    return (_read('/proc/sys/kernel/random/boot_id') or '').strip()


def process_start_tick(pid):
    """Clock ticks after boot at which `pid` started (/proc/PID/stat field 22), or None."""
    text = _read('/proc/%d/stat' % pid)
    try:
        return int(text.rsplit(')', 1)[1].split()[19]) if text else None
    except (IndexError, ValueError):
        return None


def describe(record):
    """'host h, pid 123, started 2026-11-24 08:40:12 UTC' of a lock record."""
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(record.get('started', 0)))
    return 'host %s, pid %s, started %s' % (record.get('host'), record.get('pid'), started)


def holder_alive(record, refreshed_age, host=None, boot_id=None):
    """True when the job that wrote `record` still runs (see the module's rule);
    refreshed_age: seconds since the lock file was last refreshed."""
    host = host or socket.gethostname()
    boot_id = _boot_id() if boot_id is None else boot_id
    if record.get('host') == host and record.get('boot_id') == boot_id:
        pid = record.get('pid')
        return isinstance(pid, int) and process_start_tick(pid) == record.get('start_tick')
    return refreshed_age < STALE_SECONDS


class ModelDirLock:
    """The lock of one model_dir held by this process: acquire() at start, release() at end
    (also as `with ModelDirLock(model_dir):`). release() stops and joins the refresher thread,
    so nothing of the lock outlives its holder in a long-lived process."""

    def __init__(self, model_dir):
        self.path = os.path.join(model_dir, LOCK_NAME)
        self.record = dict(host=socket.gethostname(), pid=os.getpid(), started=time.time(),
                           boot_id=_boot_id(), start_tick=process_start_tick(os.getpid()),
                           token=uuid.uuid4().hex)
        self._stop = threading.Event()
        self._refresher = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()

    def acquire(self):
        """Takes the lock, or raises ModelDirLockedError naming the live holder."""
        temporary = atomic_file.temporary_path_for(self.path)
        try:
            with open(temporary, 'w', encoding='utf-8') as stream:
                json.dump(self.record, stream)
                stream.flush()
                os.fsync(stream.fileno())  # Whole on disk before it is linked.
            if not any(self._link(temporary) for _ in range(3)):
                raise ModelDirLockedError('--model_dir=%s: %s keeps changing hands; is another '
                                          'job starting there?' % (os.path.dirname(self.path),
                                                                   self.path))
        finally:
            atomic_file.discard(temporary)
        self._refresher = threading.Thread(target=self._refresh, daemon=True,
                                           name=THREAD_NAME)
        self._refresher.start()

    def _link(self, temporary):
        """One try: True once the lock is ours; False when a gone holder's lock was moved
        away (try again); raises when a live job holds it."""
        try:
            os.link(temporary, self.path)
            return True
        except FileExistsError:
            pass
        text, age = _read(self.path), self._age()
        try:
            holder = json.loads(text) if text else {}
        except ValueError:
            holder = {}
        if text is not None and holder_alive(holder, age):
            raise ModelDirLockedError(
                '--model_dir=%s is in use by another training job (%s; lock %s refreshed %.0f s '
                'ago); wait for it to end or stop it, or use another --model_dir'
                % (os.path.dirname(self.path), describe(holder), self.path, age))
        gone = '%s.gone-%s' % (self.path, self.record['token'])
        try:
            os.rename(self.path, gone)  # Of two jobs taking it over, one rename succeeds.
        except FileNotFoundError:
            return False
        logging.warning('taking over %s of a training job that is gone (%s)', self.path,
                        describe(holder) if holder else 'unreadable lock')
        atomic_file.discard(gone)
        return False

    def _age(self):
        try:
            return max(0.0, time.time() - os.stat(self.path).st_mtime)
        except OSError:
            return 0.0

    def _owned(self):
        text = _read(self.path)
        return bool(text) and self.record['token'] in text

    def _refresh(self):
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if self._owned():
                try:
                    os.utime(self.path)
                except OSError:
                    pass

    def release(self):
        """Stops the refresher (joined with a deadline) and removes the lock if it is still
        this process's. Idempotent."""
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(JOIN_SECONDS)
            self._refresher = None
        if self._owned():
            atomic_file.discard(self.path)


@contextlib.contextmanager
def released_on_error(lock):
    """Releases `lock` (a ModelDirLock or None) when the block raises: a run that fails to
    start holds nothing."""
    try:
        yield
    except BaseException:
        if lock is not None:
            lock.release()
        raise
