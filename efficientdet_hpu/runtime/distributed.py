"""Devices and workers in one place: what the rest of the code calls (rank, size, is_main,
allreduce, allgather, broadcast, device choice, rank-tagged logging). The code is in
devices (device choice), habana (Habana's stack), ranks (Horovod) and rank_logging; nothing
outside this package imports horovod or habana_frameworks.
"""
# pylint: disable=unused-import
from efficientdet_hpu.runtime.devices import (DEVICES, DeviceError, mixed_precision_dtype,
                                              select_device)
from efficientdet_hpu.runtime.habana import habana_env_defaults
from efficientdet_hpu.runtime.rank_logging import configure_logging, rank_log_prefix
from efficientdet_hpu.runtime.ranks import (allgather_numpy, allreduce_gradients, allreduce_max,
                                            allreduce_mean, broadcast_hook, broadcast_object,
                                            init, is_distributed, is_main, local_rank,
                                            local_size, rank, size)
