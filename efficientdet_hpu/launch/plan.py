"""What demo_efficientdet.py will run, worked out without starting anything: main.py in this
process, main.py replacing a rank that mpirun started (Habana's MPIJob style), or mpirun with
its placement, hostfile, HCL config, on many boxes the ssh preflight, and for two or more ranks
the stall watch.
`build_launch` reads the environment, a hostfile and an existing HCL config but writes
nothing; `describe` is the dry-run text. launch/start.py starts what it returns."""
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile

from efficientdet_hpu import launch as hccl_config
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core import compat
from efficientdet_hpu.launch import sites
from efficientdet_hpu.launch.heartbeat import HEARTBEAT_DIR_ENV, stall_settings
from efficientdet_hpu.launch.hosts import rank_hosts
from efficientdet_hpu.launch.launcher_flags import (LaunchError, forwarded_value, model_dir_from,
                                                    parse_launcher_argv)
from efficientdet_hpu.launch.mpi_env import exported_names
from efficientdet_hpu.launch.ssh_preflight import Preflight

PROGRAM = "demo_efficientdet.py"
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
    stall_watch: tuple | None = None      # 2+ ranks: (heartbeat dir, rank hosts, seconds)

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
    preflight, watch = _rank_guards(site, environ, env, program, work_dir)
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


def _rank_guards(site, environ, env, program, work_dir):
    """(Preflight, stall watch) of a job. Many boxes: the ssh preflight, Horovod's stall
    shutdown time (default on) and the heartbeats in work_dir (shared by the boxes). One box
    of two or more ranks: the heartbeat watch alone, its heartbeats in the local temporary
    folder (a stopped rank would otherwise hang the job: Horovod's own check cannot see it);
    Horovod's settings are left as they are. HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 turns the
    watch off. Adds to `env` what the ranks need."""
    ranks = rank_hosts(site.hosts)
    if not site.multi_box and len(ranks) < 2:
        return None, None
    additions, stall_seconds = stall_settings(environ)
    heartbeat_dir = (os.path.join(work_dir, "heartbeat", f"launch_{os.getpid()}") if site.multi_box
                     else os.path.join(tempfile.gettempdir(), f"efficientdet_heartbeat_{os.getpid()}"))
    watch = (heartbeat_dir, ranks, stall_seconds) if stall_seconds else None
    if not site.multi_box:
        if watch:
            env[HEARTBEAT_DIR_ENV] = heartbeat_dir
        return None, watch
    env.update(additions, **{HEARTBEAT_DIR_ENV: heartbeat_dir})
    mpi_root = environ.get("MPI_ROOT", "").strip()
    preflight = Preflight(tuple(host.name for host in site.hosts), site.ssh_args, program[0],
                          tuple(path for path in program[1:2] if path != "-m"),
                          os.path.join(mpi_root, "bin", "orted") if mpi_root else "orted")
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
                          f"entry point (default: main.py beside {PROGRAM})")
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
    # Checked here, once: each rank's main.py would say it, after mpirun started them all.
    problem = recipe.recipe_file_error((forwarded_value(forwarded, 'hparams') or '').split(',')[0])
    if problem:
        raise LaunchError(problem)
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
