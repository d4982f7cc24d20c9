"""Devices and workers in one place: what the rest of the code calls (rank, size, is_main,
allreduce, allgather, broadcast, device choice, rank-tagged logging). The code is in
devices (device choice), habana (Habana's stack), ranks (Horovod) and rank_logging; nothing
outside this package imports horovod or habana_frameworks.

init() also starts this rank's heartbeat when demo_efficientdet.py's multi-box mpirun asks for
one (launch/heartbeat.py says why and how the launcher reads it).
"""
# pylint: disable=unused-import
from efficientdet_hpu.runtime import ranks
from efficientdet_hpu.runtime import rank_heartbeat
from efficientdet_hpu.runtime.devices import (DEVICES, DeviceError, mixed_precision_dtype,
                                              select_device)
from efficientdet_hpu.runtime.habana import habana_env_defaults
from efficientdet_hpu.runtime.rank_logging import configure_logging, rank_log_prefix
from efficientdet_hpu.runtime.ranks import (allgather_numpy, allreduce_gradients, allreduce_max,
                                            allreduce_mean, broadcast_hook, broadcast_object,
                                            is_distributed, is_main, local_rank,
                                            local_size, rank, size)


def init(use_horovod=None):
    """ranks.init(use_horovod), then the heartbeat the launcher asked for, if any
    (runtime/rank_heartbeat.py)."""
    ranks.init(use_horovod)
    rank_heartbeat.start_if_asked()
