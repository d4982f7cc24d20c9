"""Starting what launch/plan.py worked out: main.py in place of the launcher
(`exec_single_process`), or mpirun in a process group of its own with the launcher's stop
signals forwarded to the ranks and, on many boxes, the stall watch (`run_mpirun`); the line at
a stop (`stop_line`)."""
import os
import signal
import subprocess
import sys

from efficientdet_hpu.core import processes
from efficientdet_hpu.core import run_end
from efficientdet_hpu.launch.heartbeat import stall_line
from efficientdet_hpu.launch.plan import PROGRAM

# What the launcher sends mpirun at the first of each signal. mpirun aborts the job on SIGTERM,
# SIGINT and SIGHUP (Open MPI 4: SIGTERM to the ranks, SIGKILL a second later: no time to write
# a checkpoint) but forwards SIGUSR1, SIGUSR2 and SIGALRM to every rank untouched; main.py takes
# them as SIGINT, SIGTERM and SIGHUP (engine/preemption.py): it checkpoints and ends.
_FORWARDED_SIGNALS = {signal.SIGINT: signal.SIGUSR1, signal.SIGTERM: signal.SIGUSR2,
                      signal.SIGHUP: signal.SIGALRM}
ANNOUNCE = 'the ranks stop after their current step and write a checkpoint'
# A stop: how long the ranks get for their step and checkpoint (a D7's ~650 MB on slow storage;
# the Kubernetes manifests give the pods 120-300 s) before mpirun and the ranks are killed.
STOP_GRACE_SECONDS = 600


# mpirun in a process group of its own (run_mpirun forwards signals to it itself): Popen's
# process_group is new in Python 3.11; 3.10 calls setpgid(0, 0) in the child itself.
_OWN_PROCESS_GROUP = ({'process_group': 0} if sys.version_info >= (3, 11)
                      else {'preexec_fn': os.setpgrp})


def _forward(process, signum):
    if process.poll() is None:
        process.send_signal(_FORWARDED_SIGNALS[signum])


def _kill_job(process):
    """mpirun, its ranks and whatever they started, unless mpirun has ended (and its ranks)."""
    if process.returncode is None:
        processes.kill_tree(process.pid)


def run_mpirun(command, env, stall_watch=None, grace_seconds=STOP_GRACE_SECONDS):
    """Runs mpirun; returns its exit status (128+N if it died of signal N, as a shell says).

    mpirun gets a process group of its own and the launcher passes SIGINT, SIGTERM and SIGHUP
    on (processes.stops_forwarded), so a signal sent to the launcher or its whole group
    (Ctrl-C, `timeout`, a batch system, a Kubernetes pod's termination) reaches mpirun exactly
    once, as the signal the ranks stop on at the next step with a checkpoint; the launcher
    waits for them up to grace_seconds, then kills mpirun and the ranks of this box (other
    boxes' ranks end with their orted), and raises processes.Stopped. A second signal does
    that at once. Outside the terminal's foreground group mpirun must not read the terminal,
    so its stdin is /dev/null (training reads none). `stall_watch` (a heartbeat.StallWatch)
    ends the job on a rank that stopped answering.
    """
    with processes.stops_forwarded(PROGRAM, grace_seconds, ANNOUNCE):
        with processes.watch(lambda: subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                                      **_OWN_PROCESS_GROUP),
                             command, _kill_job, _forward) as process:
            returncode = _wait_watching(process, stall_watch)
            processes.raise_if_stopped(command, returncode)
    return returncode if returncode >= 0 else 128 - returncode


_STALL_EXIT_SECONDS = 30  # mpirun's own abort (SIGTERM, then SIGKILL to every rank) fits


def _wait_watching(process, stall_watch):
    """process.wait(), a second at a time: a stop's deadline is kept, and the ranks'
    heartbeats checked when watched. On a stalled rank: its line, SIGTERM to mpirun (which
    aborts the job on every box), and SIGKILL to mpirun and its ranks if it has not ended
    _STALL_EXIT_SECONDS later."""
    while True:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        processes.enforce_stop_deadline()
        stall = stall_watch.check() if stall_watch is not None else None
        if stall is None:
            continue
        print(f"{PROGRAM}: {stall_line(stall, len(stall_watch.rank_hosts))}",
              file=sys.stderr, flush=True)
        process.terminate()
        try:
            returncode = process.wait(timeout=_STALL_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            processes.kill_tree(process.pid)
            returncode = process.wait(timeout=_STALL_EXIT_SECONDS)
        return returncode or 1


def stop_line(stop, model_dir):
    """The launcher's line at a stop signal: what model_dir keeps (its newest checkpoint)."""
    checkpoint = run_end.newest_checkpoint(model_dir) if model_dir else None
    if checkpoint:
        stop.kept = (f"checkpoint {checkpoint} kept in {model_dir}; rerun the same command to "
                     f"continue")
    elif model_dir and "://" in model_dir:  # Object storage: not read from here.
        stop.kept = (f"the newest checkpoint in {model_dir} is kept; rerun the same command to "
                     f"continue")
    elif model_dir:
        stop.kept = f"no checkpoint in {model_dir} yet; rerun the same command to start again"
    return stop.line(PROGRAM)


def exec_single_process(command, env):
    """Replaces the launcher with main.py: signals, stdin and exit status are then main.py's."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
