"""Launches main.py: as one process, on one box under mpirun, on many boxes, in a Kubeflow
MPIJob launcher pod, or as a rank that mpirun started (Habana's MPIJob style).

    python demo_efficientdet.py [--use_horovod N] [--hls_type HLS1|HLS1-H|HLS2]
        [--kubernetes_run] [--dry_run] [--main_script PATH] <main.py flags>

Only the launcher's own flags are read here; every other argument reaches main.py unchanged and
in order. main.py is not told it runs distributed by a flag: it sees OMPI_COMM_WORLD_SIZE > 1 and
initialises Horovod itself. When this program finds itself started by mpirun (OMPI_COMM_WORLD_SIZE,
PMI_SIZE, ... in its environment), as in `mpirun -np 16 python demo_efficientdet.py --use_horovod 8
--kubernetes_run=True ...`, it becomes main.py in the same process and never starts mpirun.
Environment read here: MULTI_HLS_IPS, DOCKER_SSHD_PORT, MPI_SSH_ARGS, MPI_TCP_INCLUDE, MPI_ROOT,
MPI_MAP_BY, HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, HCL_PORT,
HCL_CONFIG_PATH, HCL_CONFIG_AUTOGEN_PATH and OMPI_MCA_orte_default_hostfile (see
docs/launching.md and k8s/README.md). Many boxes (MULTI_HLS_IPS or --hostfile) are checked over
ssh before any rank starts (launch/ssh_preflight.py); a job of two or more ranks is watched for
a rank that stops answering (launch/heartbeat.py). The launch itself is worked out by launch/plan.py and started by
launch/start.py; this module parses, reports and calls.
"""
import os
import shutil
import sys

from efficientdet_hpu import launch as hccl_config
from efficientdet_hpu.core import errors
from efficientdet_hpu.core.processes import Stopped
from efficientdet_hpu.launch import (ClusterConfigError, Host, LaunchError, LauncherArgs,
                                     model_dir_from, parse_launcher_argv)
from efficientdet_hpu.launch.heartbeat import StallWatch
from efficientdet_hpu.launch.plan import PROGRAM, RANK_LOG_DIR, Launch, build_launch, describe
from efficientdet_hpu.launch.ssh_preflight import run_preflight
from efficientdet_hpu.launch.start import exec_single_process, run_mpirun, stop_line

# The launcher's names as before the move to launch/ (tests and scripts import them from here).
__all__ = ['ClusterConfigError', 'Host', 'Launch', 'LaunchError', 'LauncherArgs', 'RANK_LOG_DIR', 'USAGE',
           'build_launch', 'describe', 'entry_point', 'exec_single_process', 'main',
           'model_dir_from', 'parse_launcher_argv', 'run_mpirun']

USAGE = """usage: python demo_efficientdet.py [launcher flags] <main.py flags: main.py --help>
  --use_horovod N   ranks per box, run under mpirun (N >= 1)
  --hls_type T      box type for the HCL config: HLS1 (8 Gaudi), HLS1-H (4), HLS2 (8 Gaudi2)
  --kubernetes_run  run inside an MPIJob launcher pod (hostfile from the mpi-operator); under
                    mpirun (a rank of Habana's MPIJob style) main.py runs in this process
  --dry_run         print the command, HCL config and hostfile; launch nothing
  --main_script P   entry point to launch (default: the checkout's main.py)
  --hostfile PATH   run on the boxes of an Open MPI hostfile ('host slots=N' lines) over ssh,
                    as MULTI_HLS_IPS does (docs/launching.md#many-boxes)
  --                everything after it goes to main.py, even launcher flag names
main.py's --dump_all_ranks also makes mpirun write each rank's output to
<model_dir>/rank_logs/1/rank.<r>/stdout."""


def _fail(message):
    return errors.fail(PROGRAM, message)


def main(argv=None, environ=None):
    """Command-line entry: returns the exit status (2 for bad input, else the child's)."""
    environ = os.environ if environ is None else environ
    try:
        launch = build_launch(sys.argv[1:] if argv is None else argv, environ)
    except (LaunchError, ClusterConfigError) as error:
        return _fail(error)
    if launch.show_help:
        print(USAGE)
        return 0
    for warning in launch.warnings:
        print(f"{PROGRAM}: warning: {warning}", file=sys.stderr)
    if launch.dry_run:
        print(describe(launch))
        return 0
    if launch.preflight is not None:
        try:
            run_preflight(launch.preflight)
        except ClusterConfigError as error:
            return _fail(error)
    for path, text in launch.files:
        try:
            hccl_config.write_text_atomically(path, text)
        except OSError as error:
            return _fail(f"cannot write {path} ({error.strerror}); pass a writable --model_dir "
                         f"or set HCL_CONFIG_AUTOGEN_PATH")
    print(f"{PROGRAM}: running: {describe(launch)}", file=sys.stderr, flush=True)
    if not launch.uses_mpirun:
        exec_single_process(launch.command, launch.env)
    try:
        if launch.stall_watch is None:
            return run_mpirun(launch.command, launch.env)
        heartbeat_dir, hosts, seconds = launch.stall_watch
        try:
            return run_mpirun(launch.command, launch.env,
                              StallWatch(heartbeat_dir, hosts, seconds))
        finally:
            shutil.rmtree(heartbeat_dir, ignore_errors=True)
    except Stopped as stop:  # SIGTERM, SIGINT, SIGHUP: the ranks checkpointed and ended.
        print(stop_line(stop, model_dir_from(launch.command)), file=sys.stderr, flush=True)
        return stop.exit_status


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    sys.exit(main())


if __name__ == '__main__':
    entry_point()
