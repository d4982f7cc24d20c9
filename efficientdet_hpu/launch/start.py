"""Starting what launch/plan.py worked out: main.py in place of the launcher
(`exec_single_process`), or mpirun in a process group of its own with the launcher's stop
signals forwarded to the ranks and, on many boxes, the stall watch (`run_mpirun`)."""
import os
import signal
import subprocess
import sys

from efficientdet_hpu.launch.heartbeat import stall_line
from efficientdet_hpu.launch.plan import PROGRAM

# What the launcher sends mpirun at the first of each signal. mpirun aborts the job on SIGTERM
# and SIGINT (Open MPI 4: SIGTERM to the ranks, SIGKILL a second later: no time to write a
# checkpoint) but forwards SIGUSR1/SIGUSR2 to every rank untouched; main.py takes SIGUSR2 as
# SIGTERM and SIGUSR1 as SIGINT (engine/preemption.py): it checkpoints and ends.
_FORWARDED_SIGNALS = {signal.SIGINT: signal.SIGUSR1, signal.SIGTERM: signal.SIGUSR2,
                      signal.SIGHUP: signal.SIGUSR2}


# mpirun in a process group of its own (run_mpirun forwards signals to it itself, and a
# second one ends the whole group): Popen's process_group is new in Python 3.11; 3.10 calls
# setpgid(0, 0) in the child itself.
_OWN_PROCESS_GROUP = ({'process_group': 0} if sys.version_info >= (3, 11)
                      else {'preexec_fn': os.setpgrp})


def run_mpirun(command, env, stall_watch=None):
    """Runs mpirun; returns its exit status (128+N if it died of signal N, as a shell says).

    mpirun gets a process group of its own and the launcher passes SIGINT, SIGTERM and SIGHUP
    on, so a signal sent to the launcher's whole group (Ctrl-C, `timeout`, a batch system, a
    Kubernetes pod's termination) reaches mpirun exactly once, as the signal the ranks stop
    on at the next step with a checkpoint; the launcher waits for them. A second signal ends
    the job at once: SIGKILL to mpirun's process group (mpirun and the ranks of this box;
    other boxes' ranks end with their orted). Outside the terminal's foreground group mpirun
    must not read the terminal, so its stdin is /dev/null (training reads none).
    `stall_watch` (a heartbeat.StallWatch) ends the job on a rank that stopped answering.
    """
    child, received = [], []

    def forward(signum, _frame):
        if not child or child[0].poll() is not None:
            return
        if received:
            os.killpg(child[0].pid, signal.SIGKILL)
        else:
            received.append(signum)
            print(f"{PROGRAM}: {signal.Signals(signum).name}: the ranks stop after their "
                  f"current step and write a checkpoint; send it again to end at once",
                  file=sys.stderr, flush=True)
            child[0].send_signal(_FORWARDED_SIGNALS[signum])

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED_SIGNALS}
    try:
        child.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                      **_OWN_PROCESS_GROUP))
        returncode = _wait_watching(child[0], stall_watch)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode if returncode >= 0 else 128 - returncode


_STALL_EXIT_SECONDS = 30  # mpirun's own abort (SIGTERM, then SIGKILL to every rank) fits


def _wait_watching(process, stall_watch):
    """process.wait(), checking the ranks' heartbeats every second when watched. On a stalled
    rank: its line, SIGTERM to mpirun (which aborts the job on every box), and SIGKILL to
    mpirun's process group if it has not ended _STALL_EXIT_SECONDS later."""
    if stall_watch is None:
        return process.wait()
    while True:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        stall = stall_watch.check()
        if stall is None:
            continue
        print(f"{PROGRAM}: {stall_line(stall, len(stall_watch.rank_hosts))}",
              file=sys.stderr, flush=True)
        process.terminate()
        try:
            returncode = process.wait(timeout=_STALL_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait(timeout=_STALL_EXIT_SECONDS)
        return returncode or 1


def exec_single_process(command, env):
    """Replaces the launcher with main.py: signals, stdin and exit status are then main.py's."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
