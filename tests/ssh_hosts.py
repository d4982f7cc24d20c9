"""Other "boxes" on this machine for the multi-box tests: sshd's on loopback addresses, started
by tools/ssh_test_host.sh (which installs openssh-server from Debian when sshd is missing).

- SECOND_HOST (127.0.0.2): a box with everything at the same paths (this machine's files).
- BARE_HOST (127.0.0.4): a box whose sshd runs in a mount namespace with an empty tmpfs over
  the test interpreter's venv (or, without a venv, over this checkout): the project or its
  venv is missing there.
- UNREACHABLE_HOST (127.0.0.3): nothing listens.
Open MPI treats neither address as this box (it compares with the interfaces' addresses, and
lo holds 127.0.0.1 only), so it starts their ranks through `ssh -p PORT ... HOST orted`.
"""
import dataclasses
import os
import socket
import sys

import pytest

from cli_runs import REPO, run_process

SCRIPT = os.path.join(REPO, 'tools', 'ssh_test_host.sh')
SECOND_HOST = '127.0.0.2'
UNREACHABLE_HOST = '127.0.0.3'
BARE_HOST = '127.0.0.4'
SSH_OPTIONS = '-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'


@dataclasses.dataclass(frozen=True)
class SshHosts:
    """The running test boxes: `port` (the same on each, as DOCKER_SSHD_PORT is one number),
    `keys` (one client key per box), `hidden` (the path BARE_HOST lacks), `logs` (sshd logs)."""
    port: int
    keys: tuple
    hidden: str
    logs: dict

    def env(self, **extra):
        """The launcher's environment reaching these boxes, plus `extra`."""
        ssh_args = ' '.join('-i %s' % key for key in self.keys) + ' ' + SSH_OPTIONS
        return dict(os.environ, DOCKER_SSHD_PORT=str(self.port), MPI_SSH_ARGS=ssh_args,
                    PYTHONUNBUFFERED='1', TF_CPP_MIN_LOG_LEVEL='2', **extra)


def free_port(addresses):
    """A TCP port free on every one of `addresses` right now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
        if all(_is_free(address, port) for address in addresses[1:]):
            return port
    raise RuntimeError('no common free port on %s' % (addresses,))


def _is_free(address, port):
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def hidden_path():
    """What BARE_HOST lacks: the test interpreter's venv, or this checkout without one."""
    return sys.prefix if sys.prefix != sys.base_prefix else REPO


def _script(*args):
    result = run_process(['bash', SCRIPT] + [str(arg) for arg in args], timeout=900)
    assert result.returncode == 0, result.stdout
    return result.stdout


@pytest.fixture(scope='session')
def ssh_hosts(tmp_path_factory):
    """SECOND_HOST and BARE_HOST running for the session, stopped at its end, or by their
    watchers when this process ends without its clean-up (a SIGTERM or SIGKILL to pytest)."""
    root = tmp_path_factory.mktemp('ssh_hosts')
    port = free_port([SECOND_HOST, BARE_HOST])
    boxes = {SECOND_HOST: (root / 'second', ()), BARE_HOST: (root / 'bare', ('--hide', hidden_path()))}
    started = []
    try:
        for address, (directory, extra) in boxes.items():
            _script('start', directory, '--address', address, '--port', port,
                    '--stop-with', os.getpid(), *extra)
            started.append(directory)
        yield SshHosts(port, tuple(str(directory / 'id_ed25519') for directory, _ in boxes.values()),
                       hidden_path(), {address: str(directory / 'sshd.log')
                                       for address, (directory, _) in boxes.items()})
    finally:
        for directory in started:
            _script('stop', directory)
