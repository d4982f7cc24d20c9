"""The MPI launcher's environment, both ways: what tells a process that mpirun started it as a
rank, and what the launcher hands the ranks it starts (-x exports, --prefix).
"""

import dataclasses
import os

from efficientdet_hpu.launch.hosts import ClusterConfigError

# World size and ranks-per-box variables: Open MPI, MPICH/Intel MPI (Hydra), MVAPICH2.
_WORLD_SIZE_NAMES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_LOCAL_SIZE_NAMES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")
# Rank variables that mark an MPI process even where no size is exported (PMIx under srun).
_RANK_NAMES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")

# Passed to every rank with -x when set: Python and the libraries' search paths, then the
# variables of TensorFlow, Horovod and Habana's stack (graph compiler GC_*, TPC kernels TPC_*,
# SynapseAI SYN*, the Habana TF bridge HBN*, HCL/HCCL and its NCCL emulation, LOG_LEVEL_* and
# ENABLE_CONSOLE of the Habana logger), as Habana's launcher scripts forward them; where a
# multi-box job's ranks write their heartbeats (launch/heartbeat.py); and Grappler on or off
# (engine/setup.py), which every rank must run alike.
EXPORTED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED",
                  "HCL_CONFIG_PATH", "ENABLE_CONSOLE", "MULTI_HLS_IPS",
                  "EFFICIENTDET_HEARTBEAT_DIR", "EFFICIENTDET_GRAPPLER")
EXPORTED_PREFIXES = ("TF_", "HOROVOD_", "HABANA_", "HCL_", "HCCL_", "NCCL", "GC_", "TPC_", "SYN",
                     "HBN", "LOG_LEVEL_")


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """This process was started by an MPI launcher; sizes are None where it does not say."""
    world_size: int | None
    ranks_per_box: int | None


def _first_count(environ, names):
    for name in names:
        text = environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return None


def rank_env(environ):
    """RankEnv when `environ` is that of an MPI rank, else None."""
    world_size = _first_count(environ, _WORLD_SIZE_NAMES)
    if world_size is None and not any(name in environ for name in _RANK_NAMES):
        return None
    if world_size is None and "PMIX_RANK" in environ:
        world_size = _first_count(environ, ("SLURM_NTASKS",))
    return RankEnv(world_size, _first_count(environ, _LOCAL_SIZE_NAMES))


def exported_names(env):
    """Names passed to the ranks with `-x`: the fixed list, then prefixed names, if set."""
    fixed = [name for name in EXPORTED_NAMES if name in env]
    prefixed = sorted(name for name in env
                      if name.startswith(EXPORTED_PREFIXES) and name not in fixed)
    return fixed + prefixed


def prefix_flags(environ):
    """`--prefix $MPI_ROOT` when MPI_ROOT is set: Open MPI then sets PATH and LD_LIBRARY_PATH
    from it on the remote boxes, whose non-interactive ssh shells may lack them."""
    root = environ.get("MPI_ROOT", "").strip()
    if not root:
        return []
    if not os.path.isfile(os.path.join(root, "bin", "mpirun")):
        raise ClusterConfigError(
            f"MPI_ROOT={root!r} has no bin/mpirun; set it to Open MPI's install root (the "
            f"directory holding bin/mpirun, e.g. /usr for /usr/bin/mpirun) or unset it")
    return ["--prefix", root]
