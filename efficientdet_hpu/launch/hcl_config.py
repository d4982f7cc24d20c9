"""The JSON file the Gaudi collective library (HCL) reads from `HCL_CONFIG_PATH`.

Contents:
  HCL_PORT   base TCP port of the collective library (env HCL_PORT, default 5332);
  HCL_TYPE   the box type (HLS1, HLS1-H or HLS2);
  HCL_COUNT  ranks on the box, when the job runs on one box; or
  HCL_RANKS  when it spans several boxes: each box's address once per rank on it, in rank order.

The launcher writes it once, before mpirun starts, and exports its path to every rank. On many
boxes every rank opens that same path, so it must be on storage all boxes share (model_dir in
practice) or be copied to each box beforehand and passed in as HCL_CONFIG_PATH.
"""

import json
import os

from efficientdet_hpu.launch.hosts import ClusterConfigError, parse_port, rank_hosts

# Gaudi cards per box for each box type.
HLS_CARDS = {"HLS1": 8, "HLS1-H": 4, "HLS2": 8}
DEFAULT_HLS_TYPE = "HLS1"
DEFAULT_HCL_PORT = 5332


def check_hls_type(hls_type):
    """Raises ClusterConfigError naming the valid box types unless `hls_type` is one."""
    if hls_type not in HLS_CARDS:
        raise ClusterConfigError(
            f"--hls_type={hls_type!r} is not a known box type; use one of "
            f"{', '.join(f'{name} ({cards} cards)' for name, cards in HLS_CARDS.items())}")


def build_hcl_config(hosts, hls_type, environ):
    """The HCL config dict for ranks placed on `hosts` (a list of hccl_config.hosts.Host)."""
    check_hls_type(hls_type)
    port_text = environ.get("HCL_PORT")
    config = {
        "HCL_PORT": parse_port(port_text, "HCL_PORT") if port_text else DEFAULT_HCL_PORT,
        "HCL_TYPE": hls_type,
    }
    if len(hosts) == 1:
        config["HCL_COUNT"] = hosts[0].slots
    else:
        config["HCL_RANKS"] = rank_hosts(hosts)
    return config


def config_path(environ, work_dir, total_ranks):
    """Where to write a generated config.

    `HCL_CONFIG_AUTOGEN_PATH` ending in `.json` is the file itself; any other value is a directory
    that receives `hcl_config_<total_ranks>.json`. Without it the file goes into `work_dir`.
    """
    file_name = f"hcl_config_{total_ranks}.json"
    autogen = environ.get("HCL_CONFIG_AUTOGEN_PATH")
    if autogen:
        return os.path.abspath(autogen if autogen.endswith(".json")
                               else os.path.join(autogen, file_name))
    return os.path.abspath(os.path.join(work_dir, file_name))


def read_config(path):
    """An existing config (from the user's HCL_CONFIG_PATH), checked to be a JSON object."""
    fix = "fix the file or unset HCL_CONFIG_PATH to let the launcher write one"
    try:
        with open(path, encoding="utf-8") as stream:
            config = json.load(stream)
    except OSError as error:
        raise ClusterConfigError(f"HCL_CONFIG_PATH={path!r} cannot be read "
                                 f"({error.strerror}); {fix}") from None
    except ValueError as error:
        raise ClusterConfigError(f"HCL_CONFIG_PATH={path!r} is not valid JSON ({error}); "
                                 f"{fix}") from None
    if not isinstance(config, dict):
        raise ClusterConfigError(f"HCL_CONFIG_PATH={path!r} holds no JSON object; {fix}")
    return config


def config_json(config):
    """The file text of a config dict."""
    return json.dumps(config, indent=2) + "\n"
