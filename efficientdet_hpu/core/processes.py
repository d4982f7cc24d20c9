"""Child processes with a deadline: the child and everything it starts, ended together.

subprocess.run(timeout=...) kills only the direct child; a grandchild (mpirun's ranks, a
converter's workers) that holds the output pipe then keeps the caller waiting. Here the child
runs in a session of its own, and at the deadline, at an interrupt, or once it has ended, every
process of that session is killed: the session, not only the process group, since the launcher
starts mpirun in a process group of its own and Open MPI puts each rank in one of its own.
"""
import os
import select
import signal
import subprocess
import time

REAP_SECONDS = 30  # After SIGKILL: the pipes close and the child is reaped.


def kill_session(pid):
    """SIGKILLs every process of the session led by `pid` (a child started with
    start_new_session=True): the child and whatever it started that did not leave the
    session (a daemon that called setsid() did)."""
    for _ in range(3):  # A process that forked while a pass was killing is caught by the next.
        members = _session_members(pid)
        for member in members:
            try:
                os.kill(member, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not members:
            return


def _session_members(session_id):
    """Ids of the processes of session `session_id` that are not zombies (Linux /proc)."""
    members = []
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/stat' % entry, encoding='ascii', errors='replace') as stat:
                fields = stat.read().rsplit(')', 1)[1].split()  # state ppid pgrp session ...
        except OSError:
            continue
        if fields[0] != 'Z' and int(fields[3]) == session_id:
            members.append(int(entry))
    return members


def run(command, timeout, cwd=None, env=None, stdin=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, input=None):  # pylint: disable=redefined-builtin
    """Runs `command` (a list) in a session of its own; returns CompletedProcess (text; stderr
    merged into stdout unless stderr=subprocess.PIPE).

    Past `timeout` seconds the whole session is killed and subprocess.TimeoutExpired raised
    with the output read so far; whatever the command left running in it is killed too.
    """
    process = subprocess.Popen(list(command), cwd=cwd, env=env, text=True, stderr=stderr,
                               stdin=subprocess.PIPE if input is not None else stdin,
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        output, errors = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(process.pid)
        output, errors = _reap(process)
        raise subprocess.TimeoutExpired(process.args, timeout, output=output,
                                        stderr=errors) from None
    except BaseException:  # An interrupt: the child's session does not get the terminal's.
        kill_session(process.pid)
        _reap(process)
        raise
    finally:
        kill_session(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)


def _reap(process):
    """What a killed child wrote, once its pipes close; (None, None) when something that left
    its session still holds them after REAP_SECONDS."""
    try:
        return process.communicate(timeout=REAP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(REAP_SECONDS)
        return None, None


def _pump(process, on_line, deadline, stop_at=None, stop_signal=signal.SIGTERM,
          stop_when=None):
    """Reads the child's output into on_line until every writer has closed the pipe; sends
    stop_signal once at stop_at (time.monotonic()) or after a line for which stop_when(line)
    is true; raises subprocess.TimeoutExpired at deadline. Returns True when it sent the
    signal."""
    descriptor, pending, stopped = process.stdout.fileno(), b'', False
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired(process.args, deadline)
        if stop_at is not None and not stopped and now >= stop_at:
            process.send_signal(stop_signal)
            stopped = True
        if not select.select([descriptor], [], [], 0.5)[0]:
            continue
        chunk = os.read(descriptor, 1 << 16)
        if not chunk:  # Every writer closed the pipe: the child has ended (or is ending).
            break
        *lines, pending = (pending + chunk).replace(b'\r', b'\n').split(b'\n')
        for line in lines:
            text = line.decode('utf-8', errors='replace')
            on_line(text)
            if stop_when is not None and not stopped and stop_when(text):
                process.send_signal(stop_signal)
                stopped = True
    if pending:
        on_line(pending.decode('utf-8', errors='replace'))
    return stopped


def run_streaming(command, timeout, on_line, cwd=None, env=None, stop_after=None,
                  stop_signal=signal.SIGTERM, interrupt_grace=None, stop_when=None):
    """Runs `command` (a list) in a session of its own, handing each line it writes (stdout
    and stderr merged, without the newline) to `on_line` as it comes; returns
    (exit status, True when it was asked to stop).

    stop_after: seconds after which the child is sent `stop_signal` once (a soft deadline: a
    training run then checkpoints and exits); `timeout` is the hard deadline, past which the
    whole session is killed and subprocess.TimeoutExpired raised. stop_when: a function of
    each line; the first line it is true for sends `stop_signal` too. interrupt_grace: on Ctrl-C
    (KeyboardInterrupt) the child, which does not get the terminal's signal in its own
    session, is sent stop_signal and given this many seconds to end before the interrupt goes
    on (a second Ctrl-C cuts it short); None kills it at once. No thread: the pipe is read
    with select, so nothing outlives the call.
    """
    process = subprocess.Popen(list(command), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    start = time.monotonic()
    try:
        try:
            stopped = _pump(process, on_line, start + timeout,
                            None if stop_after is None else start + stop_after, stop_signal,
                            stop_when)
        except KeyboardInterrupt:
            if interrupt_grace is None or process.poll() is not None:
                raise
            process.send_signal(stop_signal)
            try:
                _pump(process, on_line, time.monotonic() + interrupt_grace)
            except subprocess.TimeoutExpired:
                pass
            raise
        return process.wait(max(1.0, timeout - (time.monotonic() - start))), stopped
    finally:
        kill_session(process.pid)
        process.stdout.close()
        try:
            process.wait(REAP_SECONDS)
        except subprocess.TimeoutExpired:
            pass
