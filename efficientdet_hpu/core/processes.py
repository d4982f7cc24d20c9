"""Child processes with a deadline, and stop signals passed on to them.

subprocess.run(timeout=...) kills only the direct child; a grandchild (mpirun's ranks, a
converter's workers) that holds the output pipe then keeps the caller waiting. Here the child
runs in a session of its own, and at the deadline, at a stop, or once it has ended, every
process of that session is killed: the session, not only the process group, since the launcher
starts mpirun in a process group of its own and Open MPI puts each rank in one of its own.

A child in a session (or process group) of its own gets neither the terminal's Ctrl-C nor a
signal sent to its parent's process group. So a command that starts children (the fine-tune,
the launcher, bench) runs them inside `stops_forwarded`: SIGTERM, SIGINT and SIGHUP become a
stop request, passed on once to every child it is running, which takes its clean path (main.py
checkpoints the step it is at); the command waits for them up to a deadline, kills what is
left, and Stopped is raised (exit status 128+N). A signal while no child runs raises Stopped at
once, as Ctrl-C raises KeyboardInterrupt; so does a second signal, after killing the children.
The same signal again within SAME_STOP_SECONDS is the same request: `timeout` sends it to the
command and then to its process group, and make passes SIGTERM on to a recipe whose process
group got it too. A signal this process was started ignoring (nohup's SIGHUP) stays ignored.
"""
import contextlib
import os
import select
import signal
import subprocess
import time

REAP_SECONDS = 30  # After SIGKILL: the pipes close and the child is reaped.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_SECONDS = 120  # A stop: time for the children to end cleanly before they are killed.
SAME_STOP_SECONDS = 0.5
POLL_SECONDS = 0.5


class Stopped(BaseException):
    """A stop signal ended the command (inside stops_forwarded): `signum`, `exit_status`
    (128 + signum), `at_once` (a second signal cut the wait short), `command` (the child that
    was running, a list, or None) and `child_status` (its exit status, negative when a signal
    killed it). A BaseException, as KeyboardInterrupt: `except Exception` does not swallow it.
    The command fills in `where` and `kept` for its one line (`line`)."""

    def __init__(self, signum, at_once=False, command=None, child_status=None):
        self.signum, self.at_once = int(signum), at_once
        self.command, self.child_status = command, child_status
        self.exit_status = 128 + self.signum
        self.where = self.kept = None
        super().__init__('stopped by %s' % self.name)

    @property
    def name(self):
        return signal.Signals(self.signum).name

    def line(self, program):
        """'PROGRAM: stopped by SIGTERM during WHERE; KEPT' (at once: says so)."""
        head = '%s: stopped by %s' % (program, self.name)
        if self.where:
            head += ' during %s' % self.where
        if self.at_once:
            head += ' (a second stop signal: its processes were killed at once)'
        return '; '.join([head, self.kept or 'rerun the same command to start again'])


class _Child:
    def __init__(self, process, command, forward, kill):
        self.process, self.command, self.forward, self.kill = process, command, forward, kill


class _Stops:
    """The stop request of one stops_forwarded block and the children it is passed to."""

    def __init__(self, program, grace_seconds, announce):
        self.program, self.grace_seconds, self.announce = program, grace_seconds, announce
        self.signum = self.since = self.deadline = None
        self.children, self.starting, self.killed = {}, 0, False

    def on_signal(self, signum, _frame):
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.since, self.deadline = signum, now, now + self.grace_seconds
            children = list(self.children.values())
            if not children and not self.starting:
                raise Stopped(signum)
            # os.write: print() would raise if the signal came inside a print to stderr.
            os.write(2, ('%s: %s: %s; waiting up to %d s (send it again to end at once)\n' % (
                self.program, signal.Signals(signum).name, self.announce,
                self.grace_seconds)).encode())
            for child in children:
                child.forward(child.process, signum)
            return
        if signum == self.signum and now - self.since < SAME_STOP_SECONDS:
            return  # The same request twice (timeout(1), make and the process group).
        children = list(self.children.values())
        self.kill_children()
        raise Stopped(signum, at_once=True, command=children[0].command if children else None)

    def kill_children(self):
        self.killed = True
        for child in list(self.children.values()):
            child.kill(child.process)

    def enforce(self, process=None):
        """In a wait: kills the children once the stop's deadline has passed, and what is left
        of `process` once it has ended after a stop (a worker that holds the pipe)."""
        if self.signum is None or self.killed:
            return
        if time.monotonic() >= self.deadline:
            self.kill_children()
        elif process is not None and process.poll() is not None:
            kill_session(process.pid)


_active = []  # The stops_forwarded blocks entered, innermost last.


def _current():
    return _active[-1] if _active else None


@contextlib.contextmanager
def stops_forwarded(program, grace_seconds=STOP_GRACE_SECONDS,
                    announce='passed on to the running command, which ends cleanly'):
    """Within the block SIGTERM, SIGINT and SIGHUP are stop requests (the module docstring);
    the children started by run, run_streaming and watch get them. Main thread only; the
    previous handlers are put back on leaving. `program` and `announce` make the line printed
    at the first signal while a child runs."""
    stops = _Stops(program, grace_seconds, announce)
    previous = {}
    for number in STOP_SIGNALS:
        if signal.getsignal(number) != signal.SIG_IGN:
            previous[number] = signal.signal(number, stops.on_signal)
    _active.append(stops)
    try:
        yield stops
    finally:
        _active.remove(stops)
        for number, handler in previous.items():
            signal.signal(number, handler)


def _send_same(process, signum):
    if process.poll() is None:
        process.send_signal(signum)


@contextlib.contextmanager
def watch(start, command, kill, forward=_send_same):
    """Starts a child (`start()` returns its Popen), yields it, and on leaving calls
    kill(process) for whatever of it is left (SIGKILL only: it may run in a signal handler),
    then closes its pipes and reaps it. Inside stops_forwarded a stop is passed on as
    forward(process, signum) (default: the same signal), also one that came while it started;
    after a stop no child is started (Stopped)."""
    stops, child = _current(), None
    if stops is not None:
        if stops.signum is not None:
            raise Stopped(stops.signum, command=command)
        stops.starting += 1
    try:
        process = start()
        if stops is not None:
            child = _Child(process, command, forward, kill)
            stops.children[id(child)] = child
    finally:
        if stops is not None:
            stops.starting -= 1
    try:
        if child is not None and stops.signum is not None:
            forward(process, stops.signum)
        yield process
    finally:
        if child is not None:
            stops.children.pop(id(child), None)
        kill(process)
        _close_and_reap(process)


def raise_if_stopped(command, status):
    """After a child ended: raises Stopped when a stop came while it ran."""
    stops = _current()
    if stops is not None and stops.signum is not None:
        raise Stopped(stops.signum, command=list(command), child_status=status)


def enforce_stop_deadline(process=None):
    """Call in a wait loop (every POLL_SECONDS or so): see _Stops.enforce."""
    stops = _current()
    if stops is not None:
        stops.enforce(process)


def kill_session(pid):
    """SIGKILLs every process of the session led by `pid` (a child started with
    start_new_session=True): the child and whatever it started that did not leave the
    session (a daemon that called setsid() did)."""
    _kill_in_passes(lambda table: {member for member, (_, _, session) in table.items()
                                   if session == pid})


def _below(table, pid):
    """The processes below `pid` in `table` (process_table()), by parent."""
    children = {}
    for member, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(member)
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_tree(pid):
    """SIGKILLs `pid` (not yet reaped), every process below it and their process groups: mpirun
    and its ranks, which Open MPI puts in process groups of their own inside the caller's
    session (so kill_session cannot be used: it would kill the caller's shell)."""
    table = process_table()
    found = [pid] + _below(table, pid)
    groups = {table[member][1] for member in found if member in table} - {os.getpgrp()}
    for member in found:
        _kill(member)
    for group in groups:  # A process forked after the snapshot is in its parent's group.
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_descendants():
    """SIGKILLs every process below this one and every process of the sessions they lead: the
    commands it started in sessions of their own and what they left there (a child whose
    parent ended is no longer below it)."""
    def members(table):
        below = _below(table, os.getpid())
        leaders = {member for member in below if table[member][2] == member}
        return (set(below) | {member for member, (_, _, session) in table.items()
                              if session in leaders}) - {os.getpid()}
    _kill_in_passes(members)


def _kill_in_passes(members):
    """SIGKILLs members(process_table()) until it is empty, in at most three passes: a process
    that forked while a pass was killing is caught by the next."""
    for _ in range(3):
        found = members(process_table())
        for member in found:
            _kill(member)
        if not found:
            return


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def process_table():
    """{pid: (parent, process group, session)} of the processes that are not zombies (/proc)."""
    table = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/stat' % entry, encoding='ascii', errors='replace') as stat:
                fields = stat.read().rsplit(')', 1)[1].split()  # state ppid pgrp session ...
        except OSError:
            continue
        if fields[0] != 'Z':
            table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def _end_session(process):
    kill_session(process.pid)


def _close_and_reap(process):
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    try:
        process.wait(REAP_SECONDS)
    except subprocess.TimeoutExpired:
        pass


def run(command, timeout, cwd=None, env=None, stdin=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, input=None):  # pylint: disable=redefined-builtin
    """Runs `command` (a list) in a session of its own; returns CompletedProcess (text; stderr
    merged into stdout unless stderr=subprocess.PIPE).

    Past `timeout` seconds the whole session is killed and subprocess.TimeoutExpired raised
    with the output read so far; whatever the command left running in it is killed too.
    Inside stops_forwarded a stop is passed on to it, and Stopped raised once it has ended.
    """
    command, end = list(command), time.monotonic() + timeout

    def start():
        return subprocess.Popen(command, cwd=cwd, env=env, text=True, stderr=stderr,
                                stdin=subprocess.PIPE if input is not None else stdin,
                                stdout=subprocess.PIPE, start_new_session=True)
    with watch(start, command, _end_session) as process:
        while True:  # In slices under stops_forwarded, to keep the stop's deadline.
            left = end - time.monotonic()
            try:
                output, errors = process.communicate(
                    input, timeout=max(0.01, min(left, POLL_SECONDS) if _active else left))
                break
            except subprocess.TimeoutExpired:
                input = None  # Given once; communicate keeps what it has not written yet.
                if time.monotonic() < end:
                    enforce_stop_deadline(process)
                    continue
            kill_session(process.pid)
            output, errors = _reap(process)
            raise subprocess.TimeoutExpired(process.args, timeout, output=output,
                                            stderr=errors) from None
        raise_if_stopped(command, process.returncode)
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
    is true (stop_at may be a function, asked again at each poll); raises
    subprocess.TimeoutExpired at deadline. Returns True when it sent the signal."""
    descriptor, pending, stopped = process.stdout.fileno(), b'', False
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired(process.args, deadline)
        if stop_at is not None and not stopped and now >= (stop_at() if callable(stop_at)
                                                            else stop_at):
            process.send_signal(stop_signal)
            stopped = True
        enforce_stop_deadline(process)
        if not select.select([descriptor], [], [], POLL_SECONDS)[0]:
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
                  stop_signal=signal.SIGTERM, stop_when=None):
    """Runs `command` (a list) in a session of its own, handing each line it writes (stdout
    and stderr merged, without the newline) to `on_line` as it comes; returns
    (exit status, True when it was asked to stop).

    stop_after: seconds after which the child is sent `stop_signal` once (a soft deadline: a
    training run then checkpoints and exits), or a function returning them, asked again as the
    child runs (a stop that what the child reports moves); `timeout` is the hard deadline,
    past which the whole session is killed and subprocess.TimeoutExpired raised. stop_when: a
    function of each line; the first line it is true for sends `stop_signal` too. Inside
    stops_forwarded a stop signal is passed on to the child (which does not get the
    terminal's in its own session) and Stopped raised once it has ended. No thread: the pipe
    is read with select, so nothing outlives the call.
    """
    command, start = list(command), time.monotonic()

    def begin():
        return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    with watch(begin, command, _end_session) as process:
        try:
            stop_at = (None if stop_after is None
                       else (lambda: start + stop_after()) if callable(stop_after)
                       else start + stop_after)
            stopped = _pump(process, on_line, start + timeout, stop_at, stop_signal, stop_when)
            while True:  # The pipe closed; the child itself may take a moment to exit.
                try:
                    status = process.wait(POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= start + timeout:
                        raise
                    enforce_stop_deadline(process)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(process.args, timeout) from None
        raise_if_stopped(command, status)
        return status, stopped
