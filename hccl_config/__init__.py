"""Cluster layout for a multi-rank launch: which boxes run how many ranks (hosts), how ranks sit
on a box's cores (placement), and the HCL config file the Gaudi collective library reads
(hcl_config)."""

from hccl_config.atomic_file import write_text_atomically
from hccl_config.hcl_config import (DEFAULT_HCL_PORT, DEFAULT_HLS_TYPE, HLS_CARDS,
                                    build_hcl_config, check_hls_type, config_json, config_path,
                                    read_config)
from hccl_config.hosts import (ClusterConfigError, Host, format_hostfile, hosts_from_ip_list,
                               is_valid_address, parse_hostfile, parse_port, rank_hosts,
                               read_hostfile)
from hccl_config.placement import count_physical_cores, map_by_from_env, placement_flags

__all__ = [
    "ClusterConfigError", "DEFAULT_HCL_PORT", "DEFAULT_HLS_TYPE", "HLS_CARDS", "Host",
    "build_hcl_config", "check_hls_type", "config_json", "config_path", "count_physical_cores",
    "format_hostfile", "hosts_from_ip_list", "is_valid_address", "map_by_from_env",
    "parse_hostfile", "parse_port", "placement_flags", "rank_hosts", "read_config",
    "read_hostfile", "write_text_atomically",
]
