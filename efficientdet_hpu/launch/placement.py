"""How ranks sit on one box's cores: Open MPI mapping and binding flags.

MPI_MAP_BY chooses the Open MPI mapping object: `socket` (default), `slot`, or `none` for no
binding at all. Each rank is bound to PE = max(1, physical cores // ranks per box) cores; boxes
are assumed alike, so the launching box's core count stands for all of them.
"""

import os

from efficientdet_hpu.launch.hosts import ClusterConfigError

_MAP_BY_CHOICES = ("socket", "slot", "none")


def count_physical_cores():
    """Physical cores this process may run on.

    Distinct (package, core) pairs from /sys of the CPUs in the affinity mask, since Open MPI's
    `--bind-to core` and `PE=` count cores, not hardware threads. Falls back to the mask size,
    then os.cpu_count(). A cgroup CPU quota (docker --cpus) is not seen.
    """
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as package, \
                    open(topology + "core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def placement_flags(map_by, ranks_per_box, cores):
    """Open MPI binding flags and an optional warning.

    Each rank gets PE = max(1, cores // ranks_per_box) cores. When there are more ranks than
    cores (a CPU smoke test of an 8-rank job on a laptop) binding cannot work, so it is dropped.
    """
    if map_by == "none":
        return ["--bind-to", "none"], None
    if ranks_per_box > cores:
        return ["--bind-to", "none"], (
            f"{ranks_per_box} ranks per box but {cores} cores: ranks are not bound to cores")
    cores_per_rank = max(1, cores // ranks_per_box)
    return ["--bind-to", "core", "--map-by", f"{map_by}:PE={cores_per_rank}"], None


def map_by_from_env(environ, kubernetes_run):
    """MPI_MAP_BY, lower-cased; default `socket`, or `none` in an MPIJob launcher pod, which
    cannot see the workers' cores."""
    default = "none" if kubernetes_run else "socket"
    map_by = (environ.get("MPI_MAP_BY") or default).strip().lower()
    if map_by not in _MAP_BY_CHOICES:
        raise ClusterConfigError(f"MPI_MAP_BY={environ['MPI_MAP_BY']!r} is not supported; use "
                                 f"one of {', '.join(_MAP_BY_CHOICES)} or unset it")
    return map_by
