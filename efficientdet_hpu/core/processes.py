"""Child processes with a deadline: the child and everything it starts, ended together.

subprocess.run(timeout=...) kills only the direct child; a grandchild (mpirun's ranks, a
converter's workers) that holds the output pipe then keeps the caller waiting. Here the child
runs in a session of its own, and at the deadline, at an interrupt, or once it has ended, its
whole process group is killed.
"""
import os
import signal
import subprocess

REAP_SECONDS = 30  # After SIGKILL: the pipes close and the child is reaped.


def kill_group(pid):
    """SIGKILLs the process group led by `pid` (a child started with start_new_session=True):
    the child and whatever it started that is still in its group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(command, timeout, cwd=None, env=None, stdin=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, input=None):  # pylint: disable=redefined-builtin
    """Runs `command` (a list) in a session of its own; returns CompletedProcess (text; stderr
    merged into stdout unless stderr=subprocess.PIPE).

    Past `timeout` seconds the whole group is killed and subprocess.TimeoutExpired raised with
    the output read so far; whatever the command left running in its group is killed too.
    """
    process = subprocess.Popen(list(command), cwd=cwd, env=env, text=True, stderr=stderr,
                               stdin=subprocess.PIPE if input is not None else stdin,
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        output, errors = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        output, errors = process.communicate(timeout=REAP_SECONDS)
        raise subprocess.TimeoutExpired(process.args, timeout, output=output,
                                        stderr=errors) from None
    except BaseException:  # An interrupt: the child's session does not get the terminal's.
        kill_group(process.pid)
        process.communicate(timeout=REAP_SECONDS)
        raise
    finally:
        kill_group(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)
