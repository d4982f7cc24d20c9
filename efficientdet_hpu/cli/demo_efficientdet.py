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
ssh before any rank starts (launch/ssh_preflight.py) and watched for a rank that stops
answering (launch/heartbeat.py).
"""

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

from efficientdet_hpu import launch as hccl_config
from efficientdet_hpu.launch import (ClusterConfigError, Host, LaunchError,  # noqa: F401
                                     LauncherArgs, exported_names, model_dir_from,
                                     parse_launcher_argv, rank_hosts, sites)
from efficientdet_hpu.launch.heartbeat import (HEARTBEAT_DIR_ENV, StallWatch, stall_line,
                                               stall_settings)
from efficientdet_hpu.launch.ssh_preflight import Preflight, run_preflight
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import compat

USAGE = """usage: python demo_efficientdet.py [launcher flags] <main.py flags: main.py --helpfull>
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

_PROGRAM = "demo_efficientdet.py"
RANK_LOG_DIR = "rank_logs"


@dataclasses.dataclass(frozen=True)
class Launch:
    """What the launcher will run. `files` are (path, text) pairs written before launching."""
    command: list
    env: dict
    hcl_config: dict | None = None
    hcl_config_path: str | None = None
    hostfile_path: str | None = None
    hostfile_contents: str | None = None
    files: tuple = ()
    warnings: tuple = ()
    dry_run: bool = False
    show_help: bool = False
    preflight: Preflight | None = None    # multi-box: ssh to every box before starting
    stall_watch: tuple | None = None      # multi-box: (heartbeat dir, rank hosts, seconds)

    @property
    def uses_mpirun(self):
        return self.command[:1] == ["mpirun"]


def _hcl_setup(hosts, args, environ, work_dir):
    """(path, config, files to write) for the HCL config; an existing HCL_CONFIG_PATH is kept."""
    existing = environ.get("HCL_CONFIG_PATH")
    if existing:
        return existing, hccl_config.read_config(existing), ()
    config = hccl_config.build_hcl_config(hosts, args.hls_type, environ)
    path = hccl_config.config_path(environ, work_dir, sum(host.slots for host in hosts))
    return path, config, ((path, hccl_config.config_json(config)),)


def _work_dir(forwarded):
    """Where generated files go: main.py's --model_dir if it is a local path, else a temp dir."""
    model_dir = model_dir_from(forwarded)
    if model_dir and "://" not in model_dir:
        return os.path.abspath(model_dir)
    return os.path.join(tempfile.gettempdir(), f"efficientdet_launch_{os.getpid()}")


def _layout_warnings(args, hosts, environ, forwarded, hcl_path):
    warnings = []
    cards = hccl_config.HLS_CARDS[args.hls_type]
    busiest = max(host.slots for host in hosts)
    if busiest > cards:
        warnings.append(f"{busiest} ranks on one box but an {args.hls_type} box has {cards} "
                        f"Gaudi cards; fine on CPU, on Gaudi use at most {cards} per box")
    shared = model_dir_from(forwarded) or environ.get("HCL_CONFIG_AUTOGEN_PATH")
    if len(hosts) > 1 and not environ.get("HCL_CONFIG_PATH") and not shared:
        warnings.append(f"HCL config {hcl_path} is on local disk but ranks on every box read "
                        f"that path: pass --model_dir on shared storage or set "
                        f"HCL_CONFIG_AUTOGEN_PATH")
    return warnings


def _output_flags(forwarded, work_dir):
    """main.py's --dump_all_ranks: each rank's output also goes to its own file,
    <work_dir>/rank_logs/1/rank.<r>/stdout (Open MPI 4 layout; stderr merged in)."""
    if not hccl_config.forwarded_boolean(forwarded, "dump_all_ranks"):
        return []
    return ["--output-filename", os.path.join(work_dir, RANK_LOG_DIR)]


def _mpirun_command(site, placement, oversubscribe, output, env):
    command = ["mpirun", "--allow-run-as-root", "--tag-output", "--merge-stderr-to-stdout",
               *placement, *(["--oversubscribe"] if oversubscribe else []),
               "-np", str(sum(host.slots for host in site.hosts))]
    if site.hostfile is not None:
        command += ["--hostfile", site.hostfile, *site.flags]
    command += output
    for name in exported_names(env):
        command += ["-x", name]
    return command


def _mpi_launch(args, forwarded, program, environ, cores, deduce_network):
    if not shutil.which("mpirun", path=environ.get("PATH", os.defpath)):
        raise LaunchError("mpirun not found on PATH; install Open MPI (apt-get install "
                          "openmpi-bin) or add its bin directory to PATH")
    work_dir = _work_dir(forwarded)
    site = sites.site(args, environ, work_dir, deduce_network)
    hcl_path, hcl_config, files = _hcl_setup(site.hosts, args, environ, work_dir)
    if site.write_hostfile:
        files += ((site.hostfile, site.hostfile_text),)
    env = dict(environ, HCL_CONFIG_PATH=hcl_path)
    env.setdefault("PYTHONUNBUFFERED", "1")  # a dying rank's last lines reach the log
    preflight, watch = _multi_box_guards(site, environ, env, program, work_dir)
    ranks_per_box = max(host.slots for host in site.hosts)
    map_by = hccl_config.map_by_from_env(environ, args.kubernetes_run)
    placement, warning = hccl_config.placement_flags(map_by, ranks_per_box, cores)
    # Without a hostfile Open MPI allows one rank per core; a hostfile's slots= lift that.
    oversubscribe = site.hostfile is None and ranks_per_box > cores
    command = _mpirun_command(site, placement, oversubscribe, _output_flags(forwarded, work_dir),
                              env)
    warnings = ([warning] if warning else []) + _layout_warnings(args, site.hosts, environ,
                                                                 forwarded, hcl_path)
    return Launch(command + program, env, hcl_config, hcl_path, site.hostfile, site.hostfile_text,
                  files, tuple(warnings), args.dry_run, preflight=preflight, stall_watch=watch)


def _multi_box_guards(site, environ, env, program, work_dir):
    """(Preflight, stall watch) of a multi-box site, (None, None) otherwise. Adds to `env`
    Horovod's stall shutdown time (default on) and where the ranks' heartbeats go."""
    if not site.multi_box:
        return None, None
    additions, stall_seconds = stall_settings(environ)
    heartbeat_dir = os.path.join(work_dir, "heartbeat", f"launch_{os.getpid()}")
    env.update(additions, **{HEARTBEAT_DIR_ENV: heartbeat_dir})
    mpi_root = environ.get("MPI_ROOT", "").strip()
    preflight = Preflight(tuple(host.name for host in site.hosts), site.ssh_args, program[0],
                          tuple(path for path in program[1:2] if path != "-m"),
                          os.path.join(mpi_root, "bin", "orted") if mpi_root else "orted")
    watch = (heartbeat_dir, rank_hosts(site.hosts), stall_seconds) if stall_seconds else None
    return preflight, watch


def _rank_launch(args, program, environ, ranks):
    """mpirun started this process as one of its ranks (Habana's MPIJob style: the launcher pod
    runs `mpirun ... python demo_efficientdet.py --use_horovod 8 --kubernetes_run=True ...`):
    main.py replaces it, with the environment as given (HCL_CONFIG_PATH and the operator's
    variables included). Starting mpirun again from a rank would nest jobs."""
    if ranks.world_size is not None:
        try:
            legacy_flags.check_world_size(args.use_horovod, ranks.world_size,
                                          ranks_per_box=ranks.ranks_per_box)
        except legacy_flags.WorldSizeError as error:
            raise LaunchError(str(error)) from None
    return Launch(program, dict(environ), dry_run=args.dry_run)


def _training_program(main_script):
    """The training entry point each rank runs: --main_script, else the checkout's main.py,
    else (an installed package without a checkout) `-m efficientdet_hpu.cli.main`."""
    if not main_script:
        main_script = compat.root_script("main.py")
        if main_script is None:
            return ["-m", "efficientdet_hpu.cli.main"]
    main_script = os.path.abspath(main_script)
    if not os.path.isfile(main_script):
        raise LaunchError(f"--main_script={main_script!r} does not exist; pass the training "
                          f"entry point (default: main.py beside {_PROGRAM})")
    return [main_script]


def build_launch(argv, environ, *, cores=None, python=None, deduce_network=None):
    """The Launch for `argv` (the arguments after the program name) in `environ`.

    Pure: reads the environment, the hostfile and an existing HCL config but writes nothing.
    `cores` (physical cores per box), `python` (the interpreter running main.py) and
    `deduce_network` (host names -> subnet, used for MULTI_HLS_IPS without MPI_TCP_INCLUDE)
    default to this machine's count, sys.executable and hccl_config.deduce_tcp_include.
    Raises LaunchError or ClusterConfigError.
    """
    args, forwarded = parse_launcher_argv(argv)
    if args.show_help:
        return Launch([], {}, show_help=True)
    program = [python or sys.executable, *_training_program(args.main_script), *forwarded]
    ranks = hccl_config.rank_env(environ)
    if ranks is not None:
        return _rank_launch(args, program, environ, ranks)
    if args.use_horovod is None and not args.kubernetes_run and not args.hostfile:
        warnings = (("MULTI_HLS_IPS has no effect without --use_horovod N",)
                    if environ.get("MULTI_HLS_IPS") else ())
        return Launch(program, dict(environ), warnings=warnings, dry_run=args.dry_run)
    cores = cores or hccl_config.count_physical_cores()
    return _mpi_launch(args, forwarded, program, environ, cores,
                       deduce_network or hccl_config.deduce_tcp_include)


def describe(launch):
    """Dry-run text: the command on one line, then the HCL config and hostfile as comments."""
    lines = [shlex.join(launch.command)]
    if launch.hcl_config is not None:
        lines.append(f"# HCL config {launch.hcl_config_path}:")
        lines.append(hccl_config.config_json(launch.hcl_config).rstrip("\n"))
    if launch.hostfile_path is not None:
        lines.append(f"# hostfile {launch.hostfile_path}:")
        lines.append(launch.hostfile_contents.rstrip("\n"))
    return "\n".join(lines)


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
            print(f"{_PROGRAM}: {signal.Signals(signum).name}: the ranks stop after their "
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
        print(f"{_PROGRAM}: {stall_line(stall, len(stall_watch.rank_hosts))}",
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


def _fail(message):
    return errors.fail(_PROGRAM, message)


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
        print(f"{_PROGRAM}: warning: {warning}", file=sys.stderr)
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
    print(f"{_PROGRAM}: running: {describe(launch)}", file=sys.stderr, flush=True)
    if not launch.uses_mpirun:
        exec_single_process(launch.command, launch.env)
    if launch.stall_watch is None:
        return run_mpirun(launch.command, launch.env)
    heartbeat_dir, hosts, seconds = launch.stall_watch
    try:
        return run_mpirun(launch.command, launch.env, StallWatch(heartbeat_dir, hosts, seconds))
    finally:
        shutil.rmtree(heartbeat_dir, ignore_errors=True)


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    sys.exit(main())


if __name__ == '__main__':
    entry_point()
