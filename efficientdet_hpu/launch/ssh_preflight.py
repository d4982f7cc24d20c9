"""Before a multi-box job starts: can every other box be reached over ssh, and does it hold this
job's interpreter, training script and Open MPI daemon at the same paths?

mpirun starts the ranks of another box through `ssh BOX orted ...`; a box that does not answer,
asks for a password or lacks the venv makes it fail late and at length (or wait on ssh's own
time-outs). The pre-flight asks every box at once, each with a short ConnectTimeout, in
BatchMode (a key, never a password prompt) and under one deadline, and turns what is wrong
into one line naming each box and the fix.

The ssh options are the ones mpirun is given (`--mca plm_rsh_args`): `-p DOCKER_SSHD_PORT`
(Habana's variable, default 3022) and the words of MPI_SSH_ARGS (for example
`-i ~/.ssh/cluster_key -o StrictHostKeyChecking=accept-new`).
"""

import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time

from efficientdet_hpu.launch.hosts import ClusterConfigError, parse_port
from efficientdet_hpu.launch.network import local_networks, resolve

DEFAULT_SSHD_PORT = 3022   # Habana's containers run sshd there (DOCKER_SSHD_PORT)
CONNECT_TIMEOUT = 5        # seconds for the TCP connection and ssh's banner
DEADLINE = 20              # seconds for the whole pre-flight, every box at once
_MISSING = "missing:"


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What to check: `hosts` reached as `ssh <ssh_args> HOST`, each needing the executable
    `interpreter`, the files `files` (the training script) and `daemon` (Open MPI's orted) as
    a command on PATH or an absolute path. Boxes that are this one are skipped."""
    hosts: tuple
    ssh_args: tuple
    interpreter: str
    files: tuple = ()
    daemon: str = "orted"


def ssh_args(environ):
    """The ssh options of every connection to another box: `-p PORT` and MPI_SSH_ARGS."""
    port_text = environ.get("DOCKER_SSHD_PORT", "").strip()
    port = parse_port(port_text, "DOCKER_SSHD_PORT") if port_text else DEFAULT_SSHD_PORT
    extra_text = environ.get("MPI_SSH_ARGS", "")
    try:
        extra = shlex.split(extra_text)
    except ValueError as error:
        raise ClusterConfigError(f"MPI_SSH_ARGS={extra_text!r} does not parse ({error}); write "
                                 f"ssh options such as '-i /root/.ssh/key -o User=root'") from None
    spaced = [word for word in extra if any(space in word for space in " \t\n")]
    if spaced:
        # Open MPI splits plm_rsh_args on white space whatever the quoting.
        raise ClusterConfigError(f"MPI_SSH_ARGS: {spaced[0]!r} holds a space, which mpirun "
                                 f"cannot pass to ssh; use a path without spaces")
    return ("-p", str(port), *extra)


def is_this_box(name, networks=None):
    """True when mpirun starts `name`'s ranks here without ssh: localhost, this host's name, or
    an address of one of its interfaces (Open MPI's own test; 127.0.0.2 is not one)."""
    if name in ("localhost", socket.gethostname()):
        return True
    address = resolve(name)
    networks = local_networks() if networks is None else networks
    return address is not None and address in networks


def remote_check(interpreter, files, daemon):
    """The shell command a box runs: one `missing: WHAT` line per absent path or daemon."""
    checks = [f"test -x {shlex.quote(interpreter)} || echo {_MISSING} {shlex.quote(interpreter)}"]
    checks += [f"test -f {shlex.quote(path)} || echo {_MISSING} {shlex.quote(path)}"
               for path in files]
    if daemon.startswith("/"):
        checks.append(f"test -x {shlex.quote(daemon)} || echo {_MISSING} {shlex.quote(daemon)}")
    else:
        checks.append(f"command -v {daemon} >/dev/null || echo {_MISSING} {daemon}")
    return "; ".join(checks)


def ssh_command(host, ssh_options, command):
    """ssh in BatchMode with a short ConnectTimeout; the first value of an option wins in ssh,
    so these two hold whatever MPI_SSH_ARGS says."""
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            *ssh_options, host, command]


def run_preflight(preflight, deadline=DEADLINE):
    """Checks every box of `preflight` at once; raises ClusterConfigError naming each box that
    does not answer, refuses the key or lacks a path, with the fix. Returns within `deadline`
    seconds plus a few for killing an ssh that did not end."""
    if shutil.which("ssh") is None:
        raise ClusterConfigError("ssh not found on PATH; mpirun reaches the other boxes with it: "
                                 "install the OpenSSH client (apt-get install openssh-client)")
    command = remote_check(preflight.interpreter, preflight.files, preflight.daemon)
    networks = local_networks()
    processes = {host: subprocess.Popen(ssh_command(host, preflight.ssh_args, command),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
                 for host in preflight.hosts if not is_this_box(host, networks)}
    end = time.monotonic() + deadline
    unreachable, lacking = [], []
    for host, process in processes.items():
        try:
            output, errors = process.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # ssh and a ProxyCommand it may run
            process.communicate(timeout=5)
            unreachable.append(f"ssh to {host} failed (no answer within {deadline} s)")
            continue
        missing = [line[len(_MISSING):].strip() for line in output.splitlines()
                   if line.startswith(_MISSING)]
        if process.returncode == 255 or (process.returncode and not missing):
            reason = _last_line(errors) or f"ssh exit status {process.returncode}"
            unreachable.append(f"ssh to {host} failed ({reason})")
        elif missing:
            lacking.append(f"{host} lacks {', '.join(missing)}")
    if unreachable or lacking:
        raise ClusterConfigError(_message(preflight, unreachable, lacking))


def _last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1].rstrip(".").removeprefix("ssh: ") if lines else ""


def _message(preflight, unreachable, lacking):
    port = preflight.ssh_args[preflight.ssh_args.index("-p") + 1]
    parts, fixes = [], []
    if unreachable:
        parts.append("; ".join(unreachable))
        fixes.append(f"each box needs sshd on port {port} (DOCKER_SSHD_PORT) and this user's "
                     f"key (`ssh -p {port} -o BatchMode=yes BOX true` must work; ssh-copy-id, "
                     f"or MPI_SSH_ARGS='-i KEY')")
    if lacking:
        parts.append("; ".join(lacking))
        fixes.append("every box needs this project, its venv and Open MPI at the same paths "
                     "as this one (same image, or a shared file system)")
    return (f"no rank started: {'; '.join(parts)}; fix: {'; '.join(fixes)} "
            f"(docs/launching.md#many-boxes)")
