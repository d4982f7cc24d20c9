"""Where the ranks of a launcher job run (a site): the boxes in rank order, the hostfile telling
mpirun so, and the mpirun flags reaching them.

- one box: `--use_horovod N` alone;
- many boxes reached over ssh, as Habana's scripts do: MULTI_HLS_IPS=ip1,ip2 (N ranks each) or
  the launcher's `--hostfile PATH` (Open MPI's `host slots=N` lines); the ssh port is
  DOCKER_SSHD_PORT (default 3022) plus MPI_SSH_ARGS, the network MPI_TCP_INCLUDE or deduced,
  Open MPI's install MPI_ROOT (--prefix); such a site is checked over ssh before it starts;
- a Kubeflow MPIJob launcher pod (`--kubernetes_run`): the mpi-operator's hostfile.
"""

import dataclasses
import os

from efficientdet_hpu.launch.hosts import (Host, format_hostfile, hosts_from_ip_list,
                                           parse_hostfile, read_hostfile)
from efficientdet_hpu.launch.launcher_flags import LaunchError
from efficientdet_hpu.launch.mpi_env import prefix_flags
from efficientdet_hpu.launch.network import tcp_include_flags
from efficientdet_hpu.launch.ssh_preflight import ssh_args

DEFAULT_K8S_HOSTFILE = "/etc/mpi/hostfile"


@dataclasses.dataclass(frozen=True)
class Site:
    """Where the ranks run: hosts in rank order and the hostfile telling mpirun so.
    `ssh_args` is set for boxes mpirun reaches over ssh (the pre-flight uses the same)."""
    hosts: list
    hostfile: str | None = None
    hostfile_text: str | None = None
    write_hostfile: bool = False  # False: the file is the user's or the mpi-operator's
    flags: tuple = ()
    ssh_args: tuple | None = None

    @property
    def multi_box(self):
        return self.ssh_args is not None


def _hostfile_hosts(path, text, use_horovod, fix_slots, fix_disagree):
    """Hosts of a hostfile with every slot count known: a bare line takes --use_horovod."""
    hosts = parse_hostfile(text, repr(path))
    for host in hosts:
        if host.slots is None and use_horovod is None:
            raise LaunchError(f"hostfile {path!r}: host {host.name!r} has no slots=; "
                              f"{fix_slots}")
        if host.slots is not None and use_horovod not in (None, host.slots):
            raise LaunchError(f"--use_horovod {use_horovod} disagrees with hostfile {path!r} "
                              f"({host.name} slots={host.slots}); {fix_disagree}")
    return hosts


def _site_from_hostfile(path, text, hosts, use_horovod, work_dir, flags, ssh=None):
    """The given hostfile when every line has slots=; else a written one where bare lines take
    --use_horovod, so Open MPI places ranks exactly as HCL_RANKS says."""
    if all(host.slots is not None for host in hosts):
        return Site(hosts, path, text, flags=flags, ssh_args=ssh)
    hosts = [Host(host.name, host.slots or use_horovod) for host in hosts]
    total = sum(host.slots for host in hosts)
    return Site(hosts, os.path.join(work_dir, f"mpi_hostfile_{total}"), format_hostfile(hosts),
                True, flags, ssh)


def single_box_site(args):
    return Site([Host("localhost", args.use_horovod)])


def multi_box_site(args, environ, work_dir, deduce_network):
    """Boxes of MULTI_HLS_IPS or --hostfile, reached over ssh as Habana's scripts do."""
    if args.hostfile:
        path = os.path.abspath(args.hostfile)
        text = read_hostfile(path, "pass --hostfile a readable Open MPI hostfile")
        hosts = _hostfile_hosts(path, text, args.use_horovod,
                                "add slots=N (ranks on that box) or pass --use_horovod N",
                                "drop --use_horovod or change slots=")
    else:
        hosts = hosts_from_ip_list(environ["MULTI_HLS_IPS"], args.use_horovod)
    ssh = ssh_args(environ)
    network = tcp_include_flags(environ, [host.name for host in hosts], deduce_network)
    # Open MPI splits plm_rsh_args on spaces (ssh_args refuses words holding one).
    flags = ("--mca", "plm_rsh_args", " ".join(ssh), *network, *prefix_flags(environ))
    if args.hostfile:
        return _site_from_hostfile(path, text, hosts, args.use_horovod, work_dir, flags, ssh)
    return Site(hosts, os.path.join(work_dir, f"mpi_hostfile_{len(hosts) * args.use_horovod}"),
                format_hostfile(hosts), True, flags, ssh)


def kubernetes_site(args, environ, work_dir):
    path = environ.get("OMPI_MCA_orte_default_hostfile") or DEFAULT_K8S_HOSTFILE
    text = read_hostfile(path, "--kubernetes_run needs the MPIJob launcher pod's "
                               "hostfile, or OMPI_MCA_orte_default_hostfile naming one")
    hosts = _hostfile_hosts(path, text, args.use_horovod,
                            "add slots=N (slotsPerWorker in the MPIJob) or pass --use_horovod N",
                            f"drop --use_horovod or set slotsPerWorker: {args.use_horovod} in "
                            f"the MPIJob")
    # The operator sets up how mpirun reaches the workers; only what the user asks for is added.
    network = (tcp_include_flags(environ, []) if environ.get("MPI_TCP_INCLUDE") else [])
    flags = (*network, *prefix_flags(environ))
    return _site_from_hostfile(path, text, hosts, args.use_horovod, work_dir, flags)


def site(args, environ, work_dir, deduce_network):
    """The Site of the launcher flags `args` in `environ`; LaunchError on a conflict."""
    multi_hls_ips = environ.get("MULTI_HLS_IPS", "").strip()
    if args.kubernetes_run:
        if multi_hls_ips or args.hostfile:
            given = "MULTI_HLS_IPS" if multi_hls_ips else "--hostfile"
            raise LaunchError(f"{given} is given together with --kubernetes_run; in an MPIJob "
                              f"the hosts come from the operator's hostfile: drop {given}")
        return kubernetes_site(args, environ, work_dir)
    if multi_hls_ips and args.hostfile:
        raise LaunchError("MULTI_HLS_IPS and --hostfile both name the boxes; unset "
                          "MULTI_HLS_IPS or drop --hostfile")
    if multi_hls_ips or args.hostfile:
        return multi_box_site(args, environ, work_dir, deduce_network)
    return single_box_site(args)
