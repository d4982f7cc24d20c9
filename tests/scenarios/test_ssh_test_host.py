"""tools/ssh_test_host.sh --stop-with: the test box's sshd daemonizes into a session of its
own, so neither a kill of the test session's process group nor a pytest killed outright (no
fixture clean-up) reaches it; its watcher stops it once the process it serves has ended."""
import os
import time

from cli_runs import REPO, run_process, started
from ssh_hosts import _script, free_port

ADDRESS = '127.0.0.6'  # Not one of tests/ssh_hosts.py's boxes.


def _alive(pid):
    """Running: a zombie waiting for this VM's init to reap it has ended."""
    try:
        with open('/proc/%d/stat' % pid) as stream:
            return stream.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def test_the_box_stops_when_the_process_it_serves_is_killed(tmp_path):
    box = tmp_path / 'box'
    try:
        with started(['sleep', '300']) as owner:
            said = _script('start', box, '--address', ADDRESS, '--port', free_port([ADDRESS]),
                           '--stop-with', owner.pid)
            sshd = int((box / 'sshd.pid').read_text())
            assert 'stops when process %d ends' % owner.pid in said and _alive(sshd)
            time.sleep(2.5)  # The watcher leaves a live owner's box alone.
            assert _alive(sshd)
            owner.kill()
            owner.wait(10)
        deadline = time.monotonic() + 15
        while _alive(sshd) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(sshd), 'sshd %d outlived the process it served' % sshd
        found = run_process(['pgrep', '-f', 'ssh-test-host-watch.*%d' % sshd], timeout=10)
        assert found.stdout == '', 'its watcher is left: %s' % found.stdout
    finally:
        _script('stop', box)


def test_a_process_that_is_gone_is_refused_before_the_box_starts(tmp_path):
    with started(['true']) as gone:
        gone.wait(10)
    result = run_process(['bash', os.path.join(REPO, 'tools', 'ssh_test_host.sh'), 'start',
                          str(tmp_path / 'b'), '--address', ADDRESS,
                          '--port', str(free_port([ADDRESS])), '--stop-with', str(gone.pid)],
                         timeout=120)
    assert result.returncode != 0
    assert '--stop-with %d: no such process' % gone.pid in result.stdout
    assert not (tmp_path / 'b' / 'sshd.pid').exists()  # Refused before anything started.
