"""model_dir/.lock (engine/model_dir_lock.py) with real processes as holders: a live one refuses a
second job naming it, a dead or stale one is taken over with a warning, a release removes only
the holder's own lock. Plain Python, no TensorFlow; the two-job run under main.py is in
test_checkpoint_faults.py."""
import json
import os
import socket
import sys
import threading
import time

import pytest

from cli_runs import started
from efficientdet_hpu.engine import model_dir_lock


def _write_lock(model_dir, **record):
    path = os.path.join(model_dir, model_dir_lock.LOCK_NAME)
    with open(path, 'w') as f:
        json.dump(record, f)
    return path


def _record_of(pid, **changes):
    record = dict(host=socket.gethostname(), pid=pid, started=1795000000.0,
                  boot_id=model_dir_lock._boot_id(),  # pylint: disable=protected-access
                  start_tick=model_dir_lock.process_start_tick(pid), token='theirs')
    record.update(changes)
    return record


@pytest.fixture
def sleeper():
    with started([sys.executable, '-c', 'import time; time.sleep(60)']) as process:
        yield process


def test_a_live_holder_on_this_host_is_named_and_the_lock_kept(tmp_path, sleeper):
    path = _write_lock(tmp_path, **_record_of(sleeper.pid))
    with pytest.raises(model_dir_lock.ModelDirLockedError) as raised:
        model_dir_lock.ModelDirLock(str(tmp_path)).acquire()
    message = str(raised.value)
    assert ('--model_dir=%s is in use by another training job (host %s, pid %d, started '
            '2026-11-18 ' % (tmp_path, socket.gethostname(), sleeper.pid)) in message
    assert 'use another --model_dir' in message
    assert json.load(open(path))['token'] == 'theirs'


def test_a_dead_holder_is_taken_over_and_released_at_the_end(tmp_path, sleeper, caplog):
    sleeper.kill()
    sleeper.wait(timeout=30)
    _write_lock(tmp_path, **_record_of(sleeper.pid, start_tick=12345))
    lock = model_dir_lock.ModelDirLock(str(tmp_path))
    lock.acquire()
    assert json.load(open(lock.path))['pid'] == os.getpid()
    assert 'taking over %s of a training job that is gone (host %s, pid %d' % (
        lock.path, socket.gethostname(), sleeper.pid) in caplog.text
    lock.release()
    assert not os.path.exists(lock.path)
    assert os.listdir(tmp_path) == []  # No temporary or moved-aside file is left.


def test_a_recycled_pid_is_not_the_holder(tmp_path, sleeper):
    # The pid is alive, but it started later than the lock's holder did.
    _write_lock(tmp_path, **_record_of(sleeper.pid, start_tick=1))
    lock = model_dir_lock.ModelDirLock(str(tmp_path))
    lock.acquire()
    lock.release()


def test_another_hosts_lock_is_live_until_it_is_stale(tmp_path):
    path = _write_lock(tmp_path, **_record_of(1, host='node-7', boot_id='other'))
    with pytest.raises(model_dir_lock.ModelDirLockedError, match='host node-7, pid 1, started'):
        model_dir_lock.ModelDirLock(str(tmp_path)).acquire()
    old = time.time() - model_dir_lock.STALE_SECONDS - 5
    os.utime(path, (old, old))  # Its holder stopped refreshing it.
    lock = model_dir_lock.ModelDirLock(str(tmp_path))
    lock.acquire()
    assert json.load(open(path))['host'] == socket.gethostname()
    lock.release()


def test_a_release_leaves_another_jobs_lock_alone(tmp_path, sleeper):
    lock = model_dir_lock.ModelDirLock(str(tmp_path))
    lock.acquire()
    _write_lock(tmp_path, **_record_of(sleeper.pid))  # Someone replaced it meanwhile.
    lock.release()
    assert json.load(open(lock.path))['token'] == 'theirs'


def _refreshers():
    return [thread for thread in threading.enumerate() if thread.name == model_dir_lock.THREAD_NAME]


def test_release_stops_and_joins_the_refresher_at_once(tmp_path, monkeypatch):
    """The refresher sleeps HEARTBEAT_SECONDS between refreshes; release() wakes it, joins it
    and removes the lock, so a long-lived process (a test worker, a notebook) keeps none."""
    monkeypatch.setattr(model_dir_lock, 'HEARTBEAT_SECONDS', 3600)
    before = len(_refreshers())
    with model_dir_lock.ModelDirLock(str(tmp_path)) as lock:
        assert len(_refreshers()) == before + 1
        assert os.path.exists(lock.path)
        start = time.monotonic()
    assert time.monotonic() - start < 5
    assert len(_refreshers()) == before and not os.path.exists(lock.path)
    lock.release()  # Idempotent.


def test_a_run_that_fails_to_start_releases_its_lock(tmp_path):
    lock = model_dir_lock.ModelDirLock(str(tmp_path))
    lock.acquire()
    with pytest.raises(RuntimeError, match='graph'):
        with model_dir_lock.released_on_error(lock):
            raise RuntimeError('the graph did not build')
    assert not _refreshers() and not os.path.exists(lock.path)
