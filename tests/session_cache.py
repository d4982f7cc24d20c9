"""Directories built once per test session, however many pytest-xdist workers need them.

`make test` runs two workers (`-n 2 --dist loadfile`); a session-scoped fixture is built once
per worker, so a training run that tests of both workers read would be trained twice. The
first worker to ask builds it under the session's shared temporary directory, holding a file
lock; the others wait on the lock and read what it recorded (the standard xdist recipe).

What is built is read only: `assert_unchanged` compares the directory with its state when
built, so a test that writes into a shared run (instead of copying it with shutil.copytree)
fails the session.
"""
import fcntl
import json
import os
import shutil

import pytest


def shared_root(tmp_path_factory):
    """The session's temporary directory that all its workers share."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is <session basetemp>/popen-gwN.
    return base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base


def fingerprint(directory):
    """[relative path, size, mtime] of every file under directory, sorted."""
    found = []
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            stat = os.stat(path)
            found.append([os.path.relpath(path, directory), stat.st_size, stat.st_mtime_ns])
    return sorted(found)


def build_once(tmp_path_factory, name, build):
    """(directory, value): `build(directory)` run in the session's first worker that asks,
    into an empty shared directory; value is what it returned (JSON data). The others get the
    recorded value, or fail with the first worker's error if the build failed."""
    root = shared_root(tmp_path_factory)
    directory, record = root / name, root / (name + '.json')
    with open(root / (name + '.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            try:
                value = build(directory)
            except (Exception, pytest.fail.Exception) as error:
                record.write_text(json.dumps({'error': str(error)[-5000:]}))
                raise
            record.write_text(json.dumps({'value': value, 'files': fingerprint(directory)}))
        saved = json.loads(record.read_text())
    if 'error' in saved:
        pytest.fail('building the shared %s failed in another worker:\n%s'
                    % (name, saved['error']))
    return directory, saved['value']


def assert_unchanged(tmp_path_factory, name):
    """Fails when the shared directory `name` differs from its state when built."""
    root = shared_root(tmp_path_factory)
    saved = json.loads((root / (name + '.json')).read_text())
    if 'files' in saved:
        now = fingerprint(root / name)
        changed = sorted({tuple(entry) for entry in now} ^ {tuple(e) for e in saved['files']})
        assert not changed, (
            '%s is shared by the tests and read only, but these files changed during the '
            'session (copy it with shutil.copytree before writing into it): %s'
            % (root / name, changed[:10]))
