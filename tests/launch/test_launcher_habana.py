"""demo_efficientdet.py as Habana's scripts use it: a rank started by mpirun (Habana's MPIJob
style), multi-box mpirun flags (--prefix, the deduced network, the -x exports), --dump_all_ranks,
the second MPIJob manifest and the commands of Habana's EfficientDet README.

Command building is checked without running anything; three real `mpirun -np 2` runs check
what only Open MPI can tell (a rank does not start mpirun again, per-rank output files, the
multi-box flags accepted).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_runs import assert_one_line_error, run_process
from efficientdet_hpu.cli import demo_efficientdet as launcher
from efficientdet_hpu.launch import ClusterConfigError, network
from test_launcher import (AWKWARD, ECHO, HEAD, LAUNCHER, ROOT, build, echo_env, exports,
                           needs_mpirun, plain_env, rank_records, run_launcher)

HABANA_MANIFEST = ROOT / "k8s" / "mpijob-efficientdet-habana-style.yaml"
RANK_OF_TWO = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
               "OMPI_COMM_WORLD_RANK": "1"}


def fixed_network(host_names):
    return "10.9.0.0/16"


# ---------------------------------------------------------------- a rank started by mpirun


@pytest.mark.parametrize("rank_env", [
    RANK_OF_TWO, {"PMI_SIZE": "2", "PMI_RANK": "0"}, {"MV2_COMM_WORLD_SIZE": "2"},
    {"PMIX_RANK": "0", "SLURM_NTASKS": "2"}, {"OMPI_COMM_WORLD_RANK": "0"},
])
def test_a_rank_runs_main_in_place_with_its_environment_as_given(rank_env):
    env = plain_env(HCL_CONFIG_PATH="/etc/hcl/worker_config.json", **rank_env)
    argv = ["--use_horovod", "2", "--kubernetes_run=True", "--model_dir=/m", *AWKWARD]
    launch = build(argv, env)
    assert launch.command == [sys.executable, ECHO, "--model_dir=/m", *AWKWARD]
    assert not launch.uses_mpirun
    assert launch.env == env  # HCL_CONFIG_PATH and everything else untouched
    assert launch.files == () and launch.hcl_config is None and launch.warnings == ()


def test_a_rank_needs_no_launcher_flag_and_never_reads_a_hostfile():
    env = plain_env(OMPI_MCA_orte_default_hostfile="/nonexistent", **RANK_OF_TWO)
    assert not build(["--kubernetes_run"], env).uses_mpirun
    assert not build([], env).uses_mpirun


@pytest.mark.parametrize("ranks, world, per_box", [("8", "16", "8"), ("16", "16", "8")])
def test_a_rank_count_per_box_or_per_job_fits(ranks, world, per_box):
    env = plain_env(OMPI_COMM_WORLD_SIZE=world, OMPI_COMM_WORLD_LOCAL_SIZE=per_box)
    assert not build(["--use_horovod", ranks], env).uses_mpirun


def test_a_rank_count_that_disagrees_with_mpirun_is_refused():
    with pytest.raises(launcher.LaunchError, match="--use_horovod 8 disagrees with the 2 ranks"):
        build(["--use_horovod", "8"], plain_env(**RANK_OF_TWO))


# ---------------------------------------------------------------- exports, --prefix, network


def test_habana_variables_are_exported_to_the_ranks():
    names = ["GC_KERNEL_PATH", "TPC_RUNNER", "SYNAPSE_LOG", "HBN_TF_GRAPH_DUMP", "NCCL_DEBUG",
             "LOG_LEVEL_ALL", "HCCL_SOCKET_IFNAME", "ENABLE_CONSOLE"]
    env = plain_env(**{name: "1" for name in names}, LOG_LEVELS="no", MY_GC_X="no", GCX="no")
    launch = build(["--use_horovod", "2"], env, cores=4)
    exported = [launch.command[i + 1] for i, t in enumerate(launch.command) if t == "-x"]
    assert exported == ["PATH", "PYTHONUNBUFFERED", "HCL_CONFIG_PATH", "ENABLE_CONSOLE",
                        "EFFICIENTDET_HEARTBEAT_DIR",
                        "GC_KERNEL_PATH", "HBN_TF_GRAPH_DUMP", "HCCL_SOCKET_IFNAME",
                        "LOG_LEVEL_ALL", "NCCL_DEBUG", "SYNAPSE_LOG", "TPC_RUNNER"]


def fake_mpi_root(tmp_path):
    (tmp_path / "ompi" / "bin").mkdir(parents=True)
    (tmp_path / "ompi" / "bin" / "mpirun").write_text("")
    return str(tmp_path / "ompi")


def test_many_boxes_get_prefix_network_and_multi_hls_ips(tmp_path):
    root = fake_mpi_root(tmp_path)
    env = plain_env(MULTI_HLS_IPS="10.9.0.1,10.9.0.2", MPI_ROOT=root)
    launch = build(["--use_horovod", "2", f"--model_dir={tmp_path}"], env, cores=4,
                   deduce_network=fixed_network)
    start = launch.command.index("--hostfile")
    assert launch.command[start:start + 14] == [
        "--hostfile", str(tmp_path / "mpi_hostfile_4"), "--mca", "plm_rsh_args", "-p 3022",
        "--mca", "btl_tcp_if_include", "10.9.0.0/16", "--mca", "oob_tcp_if_include",
        "10.9.0.0/16", "--prefix", root, "-x"]
    assert exports(["MULTI_HLS_IPS"])[1] in launch.command


def test_one_box_needs_no_prefix_but_a_kubernetes_launcher_gets_it(tmp_path):
    root = fake_mpi_root(tmp_path)
    assert "--prefix" not in build(["--use_horovod", "2"], plain_env(MPI_ROOT=root)).command
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\n")
    env = plain_env(MPI_ROOT=root, OMPI_MCA_orte_default_hostfile=str(hostfile))
    command = build(["--kubernetes_run", f"--model_dir={tmp_path}"], env).command
    assert command[command.index("--hostfile"):][:4] == ["--hostfile", str(hostfile),
                                                         "--prefix", root]


def test_an_mpi_root_without_mpirun_is_refused(tmp_path):
    env = plain_env(MULTI_HLS_IPS="10.9.0.1,10.9.0.2", MPI_ROOT=str(tmp_path))
    with pytest.raises(ClusterConfigError, match="has no bin/mpirun; set it to Open MPI's"):
        build(["--use_horovod", "2"], env, deduce_network=fixed_network)


BOXES = {"box-a": "10.1.0.5", "box-b": "10.1.3.7", "box-c": "10.1.4.1", "gone": None,
         "localhost": "127.0.0.1"}


@pytest.mark.parametrize("hosts, networks, expected", [
    # This box is box-a; the route to box-b leaves from 10.1.0.5, on a /16.
    (["box-a", "box-b"], {"10.1.0.5": ("eth1", "10.1.0.0/16")}, "10.1.0.0/16"),
    (["localhost", "gone", "box-c"], {"10.1.0.5": ("eth1", "10.1.0.0/16")}, "10.1.0.0/16"),
    # The interface's mask cannot be read: Habana's /24.
    (["box-b"], {}, "10.1.0.0/24"),
    # Every box is this one or unknown: the default route decides, as in Habana's scripts.
    (["box-a", "localhost", "gone"], {"10.1.0.5": ("eth1", "10.1.0.0/16")}, "10.1.0.0/16"),
])
def test_network_deduction(hosts, networks, expected):
    routes = []

    def route(destination):
        routes.append(destination)
        return "10.1.0.5"
    assert network.deduce_tcp_include(hosts, networks=networks, route=route,
                                      lookup=BOXES.get) == expected
    assert routes == [BOXES["box-b"] if "box-b" in hosts else
                      BOXES["box-c"] if "box-c" in hosts else network.DEFAULT_ROUTE_PROBE]


def test_no_route_at_all_asks_for_mpi_tcp_include():
    with pytest.raises(ClusterConfigError, match="set MPI_TCP_INCLUDE to the interface"):
        network.deduce_tcp_include(["box-b"], networks={}, route=lambda _: None,
                                   lookup=BOXES.get)


def test_this_machine_lists_its_loopback_interface():
    assert network.local_networks()["127.0.0.1"][1] == "127.0.0.0/8"
    assert network.source_address("127.0.0.1") == "127.0.0.1"


# ---------------------------------------------------------------- --dump_all_ranks


@pytest.mark.parametrize("flags, dumps", [
    ([], False), (["--dump_all_ranks"], True), (["-dump_all_ranks=true"], True),
    (["--dump_all_ranks=1"], True), (["--dump_all_ranks=false"], False),
    (["--dump_all_ranks", "--nodump_all_ranks"], False), (["--dump_all_ranksx"], False),
])
def test_dump_all_ranks_gives_each_rank_an_output_file(tmp_path, flags, dumps):
    launch = build(["--use_horovod", "2", f"--model_dir={tmp_path}", *flags], plain_env(),
                   cores=4)
    expected = ["--output-filename", str(tmp_path / "rank_logs")] if dumps else []
    start = launch.command.index("-np") + 2
    assert launch.command[start:start + len(expected) + 1] == [*expected, "-x"]
    assert launch.command[-len(flags) - 1:] == [f"--model_dir={tmp_path}", *flags]


# ---------------------------------------------------------------- manifest, README commands


def test_habana_style_manifest_runs_the_launcher_under_mpirun():
    job = yaml.safe_load(HABANA_MANIFEST.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    container = specs["Launcher"]["template"]["spec"]["containers"][0]
    command = container["command"] + container["args"]
    # mpirun runs under a bash wrapper that passes a pod's SIGTERM on as SIGUSR2 (Open MPI
    # aborts the ranks on SIGTERM; engine/preemption.py): `bash -c SCRIPT mpirun ARGS...`.
    assert command[:2] == ["/bin/bash", "-c"] and 'mpirun "$@"' in command[2]
    assert "kill -USR2" in command[2]
    command = command[3:]
    assert command[0] == "mpirun" and "-np" not in command
    program = command.index("python")
    assert command[program + 1].endswith("/demo_efficientdet.py")
    args, forwarded = launcher.parse_launcher_argv(command[program + 2:])
    assert args.kubernetes_run and args.use_horovod == job["spec"]["slotsPerWorker"] == 8
    assert launcher.model_dir_from(forwarded) is not None
    exported = {command[i + 1] for i in range(program) if command[i] == "-x"}
    assert exported <= {env["name"] for env in container["env"]}
    limits = specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["habana.ai/gaudi"] == 8


# Habana's README (Model-References 1.1.0-1.3.0, TensorFlow/computer_vision/efficientdet), the
# 8-card example, with 2 ranks for this machine.
HABANA_README_ARGS = ["--backbone_ckpt=/root/tensorflow_datasets/efficientdet/backbones/"
                      "efficientnet-b0/", "--training_file_pattern=/root/tensorflow_datasets/"
                      "coco2017/tf_records/train-*", "--model_dir", "/tmp/efficientdet",
                      "--use_horovod", "2", "--keep_checkpoint_max=300"]


def test_habana_readme_command_builds_a_two_rank_mpirun():
    launch = build(HABANA_README_ARGS, plain_env(), cores=2)
    assert launch.command[:10] == [*HEAD, "--bind-to", "core", "--map-by", "socket:PE=1",
                                   "-np", "2"]
    program = launch.command.index(ECHO)
    assert launch.command[program + 1:] == [*HABANA_README_ARGS[:4], "--keep_checkpoint_max=300"]
    assert launch.hcl_config_path == "/tmp/efficientdet/hcl_config_2.json"


# ---------------------------------------------------------------- real mpirun -np 2


@needs_mpirun
def test_ranks_started_by_mpirun_run_main_without_a_second_mpirun(tmp_path):
    """Habana's MPIJob style on this machine: mpirun around the launcher."""
    env, out = echo_env(tmp_path, HCL_CONFIG_PATH="/given/by/the/operator.json")
    model_dir = tmp_path / "model"
    argv = [*AWKWARD, f"--model_dir={model_dir}"]
    result = run_process(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable,
         str(LAUNCHER), "--use_horovod", "2", "--kubernetes_run=True", "--main_script", ECHO,
         *argv], 90, env=env, stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert rank_records(out) == {rank: {"rank": rank, "size": 2, "argv": argv,
                                        "hcl_config_path": "/given/by/the/operator.json"}
                                 for rank in (0, 1)}
    assert not model_dir.exists()  # no HCL config, no hostfile written by a rank
    assert "running: mpirun" not in result.stderr


@needs_mpirun
def test_dump_all_ranks_writes_one_output_file_per_rank(tmp_path):
    env, out = echo_env(tmp_path)
    model_dir = tmp_path / "model"
    result, _ = run_launcher(["--use_horovod", "2", "--main_script", ECHO,
                              f"--model_dir={model_dir}", "--dump_all_ranks"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        text = (model_dir / "rank_logs" / "1" / f"rank.{rank}" / "stdout").read_text()
        assert f"echo_argv: rank {rank} of 2" in text
        assert f"echo_argv: rank {1 - rank} of 2" not in text
    assert sorted(rank_records(out)) == [0, 1]


@needs_mpirun
def test_multi_box_flags_are_accepted_by_mpirun(tmp_path):
    """MULTI_HLS_IPS=localhost: the multi-box command (hostfile, ssh port, deduced network,
    --prefix) on one box, which Open MPI runs without ssh."""
    mpi_root = str(Path(shutil.which("mpirun")).resolve().parents[1])
    env, out = echo_env(tmp_path, MULTI_HLS_IPS="localhost", MPI_ROOT=mpi_root)
    argv = ["--use_horovod", "2", "--main_script", ECHO, f"--model_dir={tmp_path}/model"]
    try:
        network.deduce_tcp_include(["localhost"])
    except ClusterConfigError:
        # A machine with no route at all: the launcher must say so; then name the network.
        result, _ = run_launcher(argv, env)
        assert_one_line_error(result, "MPI_TCP_INCLUDE")
        env["MPI_TCP_INCLUDE"] = "127.0.0.0/8"
    result, _ = run_launcher(argv, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--prefix " + mpi_root in result.stderr and "btl_tcp_if_include" in result.stderr
    assert sorted(rank_records(out)) == [0, 1]
    assert json.loads((tmp_path / "model" / "hcl_config_2.json").read_text())["HCL_COUNT"] == 2
    assert os.path.exists(tmp_path / "model" / "mpi_hostfile_2")
