"""The launcher's library (cli/demo_efficientdet.py parses and calls it): what to run (plan:
build_launch, describe) and starting it (start: main.py in place, or mpirun with the stop
signals forwarded); its command line (launcher_flags), which boxes run how many ranks
(hosts), where a job's ranks run and the mpirun flags reaching them (sites), the ssh check of the other boxes before a start (ssh_preflight),
how ranks sit on a box's cores (placement), the network the boxes share (network), the MPI
environment both ways (mpi_env), the watch for a rank that stops answering (heartbeat), and
the HCL config file the Gaudi collective library reads (hcl_config)."""

from efficientdet_hpu.core.atomic_file import write_text_atomically
from efficientdet_hpu.launch.hcl_config import (DEFAULT_HCL_PORT, DEFAULT_HLS_TYPE, HLS_CARDS,
                                                build_hcl_config, check_hls_type, config_json,
                                                config_path, read_config)
from efficientdet_hpu.launch.hosts import (ClusterConfigError, Host, format_hostfile,
                                           hosts_from_ip_list, is_valid_address, parse_hostfile,
                                           parse_port, rank_hosts, read_hostfile)
from efficientdet_hpu.launch.launcher_flags import (LaunchError, LauncherArgs, forwarded_boolean,
                                                    model_dir_from, parse_launcher_argv)
from efficientdet_hpu.launch.mpi_env import RankEnv, exported_names, prefix_flags, rank_env
from efficientdet_hpu.launch.network import deduce_tcp_include, tcp_include_flags
from efficientdet_hpu.launch.placement import (count_physical_cores, map_by_from_env,
                                               placement_flags)

__all__ = [
    "ClusterConfigError", "DEFAULT_HCL_PORT", "DEFAULT_HLS_TYPE", "HLS_CARDS", "Host",
    "LaunchError", "LauncherArgs", "RankEnv", "build_hcl_config", "check_hls_type",
    "config_json", "config_path", "count_physical_cores", "deduce_tcp_include",
    "exported_names", "format_hostfile", "forwarded_boolean", "hosts_from_ip_list",
    "is_valid_address", "map_by_from_env", "model_dir_from", "parse_hostfile",
    "parse_launcher_argv", "parse_port", "placement_flags", "prefix_flags", "rank_env",
    "rank_hosts", "read_config", "read_hostfile", "tcp_include_flags", "write_text_atomically",
]
