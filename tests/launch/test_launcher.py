"""demo_efficientdet.py: flag splitting, mpirun command, HCL config, hostfiles, real mpirun runs.

The real runs start `mpirun -np 2` on this machine with tests/fixtures/echo_argv.py standing in
for main.py; each rank writes what it received to a JSON file.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cli_runs import assert_one_line_error, run_process, started
from efficientdet_hpu.cli import demo_efficientdet as launcher
from efficientdet_hpu.core import processes
from efficientdet_hpu.launch import ClusterConfigError, is_valid_address, parse_hostfile

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "demo_efficientdet.py"
ECHO = str(ROOT / "tests" / "fixtures" / "echo_argv.py")
MANIFEST = ROOT / "k8s" / "mpijob-efficientdet-8card.yaml"
MPIRUN = shutil.which("mpirun")

AWKWARD = ["--hparams=a=1,b.c=2", "--x=has space", '--y="quoted"', "--z=a;b", "--u=日本語 ü",
           "--empty=", "positional", "--flag", "separate value"]
HEAD = ["mpirun", "--allow-run-as-root", "--tag-output", "--merge-stderr-to-stdout"]


def needs_mpirun(test):
    """A test of a real `mpirun -np 2` run: skipped without Open MPI, and slow (not in
    `make test-fast`)."""
    return pytest.mark.slow(pytest.mark.skipif(
        MPIRUN is None, reason="Open MPI (mpirun) is not installed")(test))


def plain_env(**extra):
    """A small, known environment: PATH reaching mpirun and python, plus `extra`."""
    path = os.pathsep.join(p for p in [os.path.dirname(MPIRUN or "/usr/bin/mpirun"),
                                       os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    return {"PATH": path, **extra}


def build(argv, env, cores=16, **options):
    return launcher.build_launch(["--main_script", ECHO, *argv], env, cores=cores, **options)


def exports(names):
    return [token for name in names for token in ("-x", name)]


# ---------------------------------------------------------------- flag splitting


def test_awkward_arguments_are_forwarded_exactly_and_launcher_flags_are_not():
    argv = [AWKWARD[0], "--use_horovod", "2", *AWKWARD[1:4], "--kubernetes_run=false",
            "--model_dir=/tmp/with space", "--hls_type=HLS2", *AWKWARD[4:], "--dry_run",
            "--main_script", ECHO, "--", "--use_horovod", "9"]
    args, forwarded = launcher.parse_launcher_argv(argv)
    assert forwarded == [*AWKWARD[:4], "--model_dir=/tmp/with space", *AWKWARD[4:],
                         "--use_horovod", "9"]
    assert args == launcher.LauncherArgs(use_horovod=2, hls_type="HLS2", kubernetes_run=False,
                                         dry_run=True, main_script=ECHO)


@pytest.mark.parametrize("argv, expected", [
    ([], False), (["--kubernetes_run"], True), (["-kubernetes_run"], True),
    (["--kubernetes_run=true"], True), (["--kubernetes_run=True"], True),
    (["--kubernetes_run=1"], True), (["--kubernetes_run=false"], False),
    (["--kubernetes_run=False"], False), (["--kubernetes_run=0"], False),
    (["--nokubernetes_run"], False), (["--kubernetes_run", "--nokubernetes_run"], False),
    (["--kubernetes_run", "--use_horovod", "2"], True),
])
def test_boolean_flag_spellings(argv, expected):
    args, forwarded = launcher.parse_launcher_argv(argv)
    assert args.kubernetes_run is expected
    assert forwarded == []


@pytest.mark.parametrize("argv, fix", [
    (["--kubernetes_run", "False"], "--kubernetes_run=false"),
    (["--kubernetes_run", "true"], "--kubernetes_run=false"),
    (["--nokubernetes_run", "0"], "--kubernetes_run=false"),
    (["--kubernetes_run=maybe"], "--kubernetes_run=false"),
    (["--nokubernetes_run=true"], "--kubernetes_run=true"),
])
def test_ambiguous_or_wrong_boolean_is_refused(argv, fix):
    with pytest.raises(launcher.LaunchError, match=fix):
        launcher.parse_launcher_argv(argv)


def test_model_dir_is_taken_from_the_last_forwarded_spelling():
    assert launcher.model_dir_from(["--model_dir", "/a", "--x=1"]) == "/a"
    assert launcher.model_dir_from(["--model_dir=/a", "-model_dir=/b c"]) == "/b c"
    assert launcher.model_dir_from(["--model_dirx=/a"]) is None


# ---------------------------------------------------------------- commands


def test_without_use_horovod_main_runs_as_one_process(tmp_path):
    launch = build([*AWKWARD], plain_env(MULTI_HLS_IPS="10.0.0.1,10.0.0.2"))
    assert launch.command == [sys.executable, ECHO, *AWKWARD]
    assert launch.hcl_config is None and launch.files == ()
    assert launch.warnings == ("MULTI_HLS_IPS has no effect without --use_horovod N",)


def test_one_box_command(tmp_path):
    env = plain_env(PYTHONPATH="/src", VIRTUAL_ENV="/venv", TF_CPP_MIN_LOG_LEVEL="2",
                    HOROVOD_CYCLE_TIME="1", HABANA_LOGS="/logs", HCCL_COMM_ID="x",
                    EFFICIENTDET_GRAPPLER="off", UNRELATED="not exported")
    launch = build(["--use_horovod", "4", f"--model_dir={tmp_path}", "--hparams=a=1"], env,
                   cores=16)
    hcl_path = str(tmp_path / "hcl_config_4.json")
    assert launch.command == [
        *HEAD, "--bind-to", "core", "--map-by", "socket:PE=4", "-np", "4",
        *exports(["PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "HCL_CONFIG_PATH",
                  "EFFICIENTDET_HEARTBEAT_DIR", "EFFICIENTDET_GRAPPLER", "HABANA_LOGS",
                  "HCCL_COMM_ID", "HOROVOD_CYCLE_TIME", "TF_CPP_MIN_LOG_LEVEL"]),
        sys.executable, ECHO, f"--model_dir={tmp_path}", "--hparams=a=1"]
    assert launch.env["HCL_CONFIG_PATH"] == hcl_path
    assert launch.env["UNRELATED"] == "not exported"  # in mpirun's env, not sent to ranks
    assert launch.hcl_config == {"HCL_PORT": 5332, "HCL_TYPE": "HLS1", "HCL_COUNT": 4}
    assert launch.files == ((hcl_path, json.dumps(launch.hcl_config, indent=2) + "\n"),)
    assert launch.hostfile_path is None and launch.warnings == ()


@pytest.mark.parametrize("map_by, cores, ranks, placement", [
    (None, 16, 4, ["--bind-to", "core", "--map-by", "socket:PE=4"]),
    (None, 7, 2, ["--bind-to", "core", "--map-by", "socket:PE=3"]),
    (None, 2, 2, ["--bind-to", "core", "--map-by", "socket:PE=1"]),
    ("slot", 7, 2, ["--bind-to", "core", "--map-by", "slot:PE=3"]),
    ("SLOT", 8, 8, ["--bind-to", "core", "--map-by", "slot:PE=1"]),
    ("none", 16, 4, ["--bind-to", "none"]),
])
def test_mpi_map_by_and_cores_per_rank(map_by, cores, ranks, placement):
    env = plain_env(**({"MPI_MAP_BY": map_by} if map_by else {}))
    launch = build(["--use_horovod", str(ranks)], env, cores=cores)
    assert launch.command[4:4 + len(placement) + 2] == [*placement, "-np", str(ranks)]


def test_more_ranks_than_cores_drops_binding_and_oversubscribes():
    launch = build(["--use_horovod", "8"], plain_env(), cores=2)
    assert launch.command[4:9] == ["--bind-to", "none", "--oversubscribe", "-np", "8"]
    assert launch.warnings == ("8 ranks per box but 2 cores: ranks are not bound to cores",)


def test_ranks_beyond_the_box_cards_only_warn():
    launch = build(["--use_horovod", "6", "--hls_type", "HLS1-H"], plain_env(), cores=12)
    assert "-np" in launch.command
    assert launch.warnings == ("6 ranks on one box but an HLS1-H box has 4 Gaudi cards; fine on "
                               "CPU, on Gaudi use at most 4 per box",)


def deduced_network(host_names):
    """Stands in for the network deduction: records the boxes it was asked about."""
    deduced_network.asked = list(host_names)
    return "10.1.0.0/16"


def two_box_command(tmp_path, **env):
    return build(["--use_horovod", "8", f"--model_dir={tmp_path}"],
                 plain_env(MULTI_HLS_IPS="10.1.0.1, box-2.cluster.local", **env), cores=16,
                 deduce_network=deduced_network)


def test_two_boxes_hostfile_ssh_port_and_hcl_ranks(tmp_path):
    launch = two_box_command(tmp_path)
    hostfile = str(tmp_path / "mpi_hostfile_16")
    assert launch.command[:15] == [
        *HEAD, "--bind-to", "core", "--map-by", "socket:PE=2", "-np", "16",
        "--hostfile", hostfile, "--mca", "plm_rsh_args", "-p 3022"]
    # Without MPI_TCP_INCLUDE the network is deduced from the route to the boxes.
    assert deduced_network.asked == ["10.1.0.1", "box-2.cluster.local"]
    assert launch.command[15:21] == ["--mca", "btl_tcp_if_include", "10.1.0.0/16",
                                     "--mca", "oob_tcp_if_include", "10.1.0.0/16"]
    assert launch.command[21:23] == ["-x", "PATH"]
    assert launch.hostfile_contents == "10.1.0.1 slots=8\nbox-2.cluster.local slots=8\n"
    assert launch.hcl_config == {"HCL_PORT": 5332, "HCL_TYPE": "HLS1",
                                 "HCL_RANKS": ["10.1.0.1"] * 8 + ["box-2.cluster.local"] * 8}
    assert dict(launch.files) == {
        str(tmp_path / "hcl_config_16.json"): json.dumps(launch.hcl_config, indent=2) + "\n",
        hostfile: launch.hostfile_contents}


def test_two_boxes_ssh_port_and_interface_overrides(tmp_path):
    launch = two_box_command(tmp_path, DOCKER_SSHD_PORT="2200", MPI_TCP_INCLUDE="eth1",
                             HCL_PORT="6000")
    assert launch.command[12:23] == [
        "--mca", "plm_rsh_args", "-p 2200", "--mca", "btl_tcp_if_include", "eth1",
        "--mca", "oob_tcp_if_include", "eth1", "-x", "PATH"]
    assert launch.hcl_config["HCL_PORT"] == 6000


def test_two_boxes_without_shared_model_dir_warn_about_the_hcl_path():
    launch = build(["--use_horovod", "2"], plain_env(MULTI_HLS_IPS="10.1.0.1,10.1.0.2"), cores=4,
                   deduce_network=deduced_network)
    assert any("shared storage" in warning for warning in launch.warnings)


def write_hostfile(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


K8S_HOSTFILE = ("# written by the mpi-operator\n\n"
                "job-worker-0.job-worker.ns.svc slots=8\n"
                "job-worker-1.job-worker.ns.svc slots=8  # second box\n")


@pytest.mark.parametrize("ranks", [[], ["--use_horovod", "8"]])
def test_kubernetes_uses_the_operator_hostfile(tmp_path, ranks):
    hostfile = write_hostfile(tmp_path, K8S_HOSTFILE)
    env = plain_env(OMPI_MCA_orte_default_hostfile=hostfile, DOCKER_SSHD_PORT="2200")
    launch = build(["--kubernetes_run", *ranks, f"--model_dir={tmp_path}/md"], env, cores=2)
    assert launch.command[:12] == [*HEAD, "--bind-to", "none", "-np", "16",
                                   "--hostfile", hostfile, "-x", "PATH"]
    assert launch.hostfile_contents == K8S_HOSTFILE
    workers = ["job-worker-0.job-worker.ns.svc", "job-worker-1.job-worker.ns.svc"]
    assert launch.hcl_config["HCL_RANKS"] == [workers[0]] * 8 + [workers[1]] * 8
    assert [path for path, _ in launch.files] == [f"{tmp_path}/md/hcl_config_16.json"]


def test_kubernetes_bare_host_lines_take_use_horovod_in_a_written_hostfile(tmp_path):
    hostfile = write_hostfile(tmp_path, "worker-0\nworker-1 slots=2\n")
    launch = build(["--kubernetes_run", "--use_horovod", "2", f"--model_dir={tmp_path}/md"],
                   plain_env(OMPI_MCA_orte_default_hostfile=hostfile), cores=2)
    written = f"{tmp_path}/md/mpi_hostfile_4"
    assert launch.command[launch.command.index("--hostfile") + 1] == written
    assert dict(launch.files)[written] == "worker-0 slots=2\nworker-1 slots=2\n"


# ---------------------------------------------------------------- HCL config


def test_hcl_config_for_one_box_with_type_and_port(tmp_path):
    launch = build(["--use_horovod", "8", "--hls_type", "HLS2"], plain_env(HCL_PORT="5400"))
    assert launch.hcl_config == {"HCL_PORT": 5400, "HCL_TYPE": "HLS2", "HCL_COUNT": 8}


@pytest.mark.parametrize("autogen, expected", [("dir", "dir/hcl_config_2.json"),
                                               ("my.json", "my.json")])
def test_hcl_config_autogen_path_is_a_directory_or_a_file(tmp_path, autogen, expected):
    env = plain_env(HCL_CONFIG_AUTOGEN_PATH=str(tmp_path / autogen))
    launch = build(["--use_horovod", "2", "--model_dir=/elsewhere"], env)
    assert launch.hcl_config_path == str(tmp_path / expected)
    assert launch.env["HCL_CONFIG_PATH"] == str(tmp_path / expected)


def test_existing_hcl_config_path_is_used_as_is(tmp_path):
    existing = tmp_path / "mine.json"
    existing.write_text('{"HCL_PORT": 1234, "HCL_COUNT": 8}')
    launch = build(["--use_horovod", "2", f"--model_dir={tmp_path}"],
                   plain_env(HCL_CONFIG_PATH=str(existing)))
    assert launch.hcl_config == {"HCL_PORT": 1234, "HCL_COUNT": 8}
    assert launch.env["HCL_CONFIG_PATH"] == str(existing)
    assert launch.files == () and "HCL_CONFIG_PATH" in launch.command


# ---------------------------------------------------------------- hosts


@pytest.mark.parametrize("text, valid", [
    ("10.0.0.1", True), ("::1", True), ("fe80::1", True), ("box-1", True),
    ("worker-0.job.ns.svc.cluster.local", True), ("a" * 63, True), ("a" * 64, False),
    ("10.0.0.256", False), ("1.2.3", False), ("-box", False), ("box-", False),
    ("bad_name", False), ("", False), ("a..b", False), ("[::1]", False), ("box 1", False),
])
def test_address_validation(text, valid):
    assert is_valid_address(text) is valid


@pytest.mark.parametrize("text, message", [
    ("", "lists no hosts"), ("# only a comment\n\n", "lists no hosts"),
    ("box slots=abc\n", "expected 'HOST' or 'HOST slots=N'"),
    ("box slots=0\n", "slots must be at least 1"),
    ("box slots=2 max_slots=4\n", "expected 'HOST' or 'HOST slots=N'"),
    ("bad_host slots=2\n", "not an IPv4/IPv6 address"),
    ("box slots=2\nbox slots=2\n", "listed twice"),
])
def test_malformed_hostfiles(text, message):
    with pytest.raises(ClusterConfigError, match=message):
        parse_hostfile(text, "h")


# ---------------------------------------------------------------- the command line


def run_launcher(argv, env, timeout=90):
    """Runs the launcher as a user would; returns (CompletedProcess, seconds taken)."""
    start = time.monotonic()
    result = run_process([sys.executable, str(LAUNCHER), *argv], timeout, env=env,
                         stderr=subprocess.PIPE)
    return result, time.monotonic() - start


def rank_records(directory, keep_pid=False):
    """{rank: what that rank recorded}; the process id only when asked for."""
    records = {}
    for path in Path(directory).glob("rank-*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        records[record["rank"]] = record if keep_pid else {
            key: value for key, value in record.items() if key != "pid"}
    return records


def echo_env(tmp_path, **extra):
    out = tmp_path / "ranks"
    out.mkdir(exist_ok=True)
    return plain_env(ECHO_ARGV_DIR=str(out), **extra), out


def test_dry_run_prints_the_command_and_hcl_config_and_launches_nothing(tmp_path):
    env, out = echo_env(tmp_path)
    model_dir = tmp_path / "with space"
    result, _ = run_launcher(["--use_horovod", "2", "--dry_run", "--main_script", ECHO,
                              f"--model_dir={model_dir}", *AWKWARD], env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected = launcher.build_launch(["--use_horovod", "2", "--main_script", ECHO,
                                      f"--model_dir={model_dir}", *AWKWARD], env)
    assert lines[0] == shlex.join(expected.command)
    assert lines[1] == f"# HCL config {model_dir}/hcl_config_2.json:"
    assert json.loads("\n".join(lines[2:])) == expected.hcl_config
    assert not model_dir.exists() and rank_records(out) == {}


BAD_INPUTS = [
    (["--use_horovod", "two"], {}, "--use_horovod='two'"),
    (["--use_horovod=0"], {}, "positive integer"),
    (["--use_horovod", "-1"], {}, "positive integer"),
    (["--use_horovod=1.5"], {}, "positive integer"),
    (["--use_horovod"], {}, "--use_horovod needs a value"),
    (["--use_horovod", "2", "--hls_type", "HLS3"], {}, "HLS1 (8 cards), HLS1-H (4 cards), HLS2"),
    (["--use_horovod", "2"], {"MULTI_HLS_IPS": "10.0.0.1,bad_host!"}, "entry 2 ('bad_host!')"),
    (["--use_horovod", "2"], {"MULTI_HLS_IPS": "10.0.0.1,"}, "entry 2 ('')"),
    (["--use_horovod", "2"], {"MPI_MAP_BY": "diagonal"}, "socket, slot, none"),
    (["--use_horovod", "2"], {"HCL_PORT": "http"}, "HCL_PORT='http' is not a TCP port"),
    (["--use_horovod", "2"], {"MULTI_HLS_IPS": "10.0.0.1,10.0.0.2", "DOCKER_SSHD_PORT": "99999"},
     "DOCKER_SSHD_PORT='99999'"),
    (["--use_horovod", "2"], {"PATH": "/nonexistent"}, "install Open MPI (apt-get install "
                                                       "openmpi-bin)"),
    (["--kubernetes_run", "False"], {}, "write --kubernetes_run=true or --kubernetes_run=false"),
    (["--kubernetes_run"], {"OMPI_MCA_orte_default_hostfile": "/nonexistent/hostfile"},
     "hostfile '/nonexistent/hostfile' cannot be read"),
    (["--kubernetes_run"], {"HOSTFILE_TEXT": ""}, "lists no hosts"),
    (["--kubernetes_run"], {"HOSTFILE_TEXT": "worker-0 slots=x\n"}, "line 1 ('worker-0 slots=x')"),
    (["--kubernetes_run"], {"HOSTFILE_TEXT": "worker-0\n"}, "has no slots=; add slots=N"),
    (["--kubernetes_run", "--use_horovod", "4"], {"HOSTFILE_TEXT": "worker-0 slots=8\n"},
     "--use_horovod 4 disagrees"),
    (["--use_horovod", "2", "--hparams", "nowhere/recipe.yaml,num_classes=3"], {},
     "--hparams=nowhere/recipe.yaml: no folder nowhere"),
]


def test_a_mistyped_recipe_is_refused_before_mpirun_and_its_suggestion_launches(tmp_path):
    env, out = echo_env(tmp_path)
    typed = f"--hparams={ROOT}/configs/demo.yam"
    result, _ = run_launcher(["--use_horovod", "2", "--main_script", ECHO, typed], env)
    assert_one_line_error(result, f"no file {ROOT}/configs/demo.yam; did you mean ",
                          starts_with="demo_efficientdet.py: error: ")
    assert rank_records(out) == {}
    suggested = result.stderr.split("did you mean ")[1].split("?")[0]
    assert suggested == f"--hparams={ROOT}/configs/demo.yaml"
    result, _ = run_launcher(["--use_horovod", "2", "--dry_run", "--main_script", ECHO,
                              f"--model_dir={tmp_path / 'model'}", suggested], env)
    assert result.returncode == 0, result.stderr
    assert suggested in result.stdout.splitlines()[0]


@pytest.mark.parametrize("argv, env_extra, message", BAD_INPUTS)
def test_bad_input_exits_2_with_a_message_before_launching(tmp_path, argv, env_extra, message):
    env, out = echo_env(tmp_path)
    env_extra = dict(env_extra)
    if "HOSTFILE_TEXT" in env_extra:
        env_extra["OMPI_MCA_orte_default_hostfile"] = write_hostfile(
            tmp_path, env_extra.pop("HOSTFILE_TEXT"))
    env.update(env_extra)
    model_dir = tmp_path / "model"
    result, _ = run_launcher(["--main_script", ECHO, f"--model_dir={model_dir}", *argv], env)
    assert result.stdout == ""
    assert_one_line_error(result, message, starts_with="demo_efficientdet.py: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert not model_dir.exists() and rank_records(out) == {}


def test_missing_main_script_is_a_bad_input(tmp_path):
    env, _ = echo_env(tmp_path)
    result, _ = run_launcher(["--main_script", str(tmp_path / "nope.py")], env)
    assert_one_line_error(result, "does not exist")


def test_one_process_run_propagates_the_exit_status(tmp_path):
    env, out = echo_env(tmp_path, ECHO_ARGV_MODE="exit:3")
    result, _ = run_launcher(["--main_script", ECHO, *AWKWARD], env)
    assert result.returncode == 3, result.stderr
    assert rank_records(out) == {0: {"rank": 0, "size": 1, "argv": AWKWARD,
                                     "hcl_config_path": None}}


@needs_mpirun
@pytest.mark.parametrize("map_by", [None, "slot", "none"])
def test_two_ranks_under_mpirun_receive_the_awkward_arguments(tmp_path, map_by):
    env, out = echo_env(tmp_path, **({"MPI_MAP_BY": map_by} if map_by else {}))
    model_dir = tmp_path / "with space"
    argv = [*AWKWARD, f"--model_dir={model_dir}"]
    result, _ = run_launcher(["--use_horovod", "2", "--main_script", ECHO, *argv], env)
    assert result.returncode == 0, result.stdout + result.stderr
    hcl_path = str(model_dir / "hcl_config_2.json")
    assert rank_records(out) == {rank: {"rank": rank, "size": 2, "argv": argv,
                                        "hcl_config_path": hcl_path} for rank in (0, 1)}
    assert json.loads(Path(hcl_path).read_text()) == {"HCL_PORT": 5332, "HCL_TYPE": "HLS1",
                                                      "HCL_COUNT": 2}


@needs_mpirun
def test_kubernetes_run_with_a_localhost_hostfile(tmp_path):
    hostfile = write_hostfile(tmp_path, "localhost slots=2\n")
    env, out = echo_env(tmp_path, OMPI_MCA_orte_default_hostfile=hostfile)
    argv = [*AWKWARD, f"--model_dir={tmp_path}/model"]
    result, _ = run_launcher(["--kubernetes_run", "--main_script", ECHO, *argv], env)
    assert result.returncode == 0, result.stdout + result.stderr
    records = rank_records(out)
    assert sorted(records) == [0, 1]
    assert all(record["argv"] == argv and record["size"] == 2 for record in records.values())


@needs_mpirun
def test_a_killed_rank_ends_the_job_promptly_with_nonzero_status(tmp_path):
    env, out = echo_env(tmp_path, ECHO_ARGV_MODE="kill_rank1")
    result, seconds = run_launcher(["--use_horovod", "2", "--main_script", ECHO,
                                    f"--model_dir={tmp_path}/model"], env, 60)
    assert result.returncode != 0
    assert seconds < 30, f"job took {seconds:.1f} s to stop after rank 1 died"
    assert sorted(rank_records(out)) == [0, 1]
    assert "signal 9" in result.stdout + result.stderr


@needs_mpirun
@pytest.mark.parametrize("signum, whole_group", [
    (signal.SIGTERM, False), (signal.SIGINT, False),
    (signal.SIGINT, True),  # Ctrl-C in a terminal: the launcher's whole process group
])
def test_a_signal_to_the_launcher_stops_every_rank(tmp_path, signum, whole_group):
    env, out = echo_env(tmp_path, ECHO_ARGV_MODE="sleep")
    with started([sys.executable, str(LAUNCHER), "--use_horovod", "2", "--main_script", ECHO,
                  f"--model_dir={tmp_path}/model"], env=env, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as process:
        deadline = time.monotonic() + 30
        while len(rank_records(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [record["pid"] for record in rank_records(out, keep_pid=True).values()]
        assert len(pids) == 2, "ranks did not start"
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        assert process.wait(timeout=30) != 0
        assert wait_until_gone(pids, 10), f"ranks {pids} outlived the launcher"


def wait_until_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- Kubernetes manifest


def test_mpijob_manifest_runs_the_launcher_for_eight_cards():
    documents = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert len(documents) == 1
    job = documents[0]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    assert sorted(specs) == ["Launcher", "Worker"] and specs["Launcher"]["replicas"] == 1
    command = specs["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "demo_efficientdet.py"]
    args, forwarded = launcher.parse_launcher_argv(command[2:])
    assert (args.kubernetes_run, args.use_horovod, args.hls_type) == (True, 8, "HLS1")
    assert launcher.model_dir_from(forwarded) is not None
    worker = specs["Worker"]["template"]["spec"]
    limits = worker["containers"][0]["resources"]["limits"]
    assert limits["habana.ai/gaudi"] == 8 == job["spec"]["slotsPerWorker"] == args.use_horovod
    assert "hugepages-2Mi" in limits
    volumes = {volume["name"]: volume for volume in worker["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert {"dataset", "model-dir"} <= {name for name, volume in volumes.items()
                                        if "persistentVolumeClaim" in volume}
    # Preemption: both pods wait for the ranks' checkpoint; the worker's sshd outlives them.
    grace = specs["Launcher"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == worker["terminationGracePeriodSeconds"] >= 60
    assert "trap" in worker["containers"][0]["args"][0]


# A rank that reports the first signal it gets, then exits 143 as main.py does at SIGTERM.
SIGNAL_REPORTER = '''
import os, signal, sys, time
got = []
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
               signal.SIGALRM):
    signal.signal(number, lambda signum, frame: got.append(signum))
with open(os.path.join(sys.argv[1], "ready-" + os.environ["OMPI_COMM_WORLD_RANK"]), "w"):
    pass
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
with open(os.path.join(sys.argv[1], "got-" + os.environ["OMPI_COMM_WORLD_RANK"]), "w") as f:
    f.write(signal.Signals(got[0]).name if got else "nothing")
if sys.argv[2:] == ["hang"]:  # A rank that does not end: only a second signal ends the job.
    time.sleep(120)
sys.exit(143)
'''


@needs_mpirun
def test_habana_style_manifest_passes_sigterm_to_the_ranks_as_sigusr2(tmp_path):
    (job,) = yaml.safe_load_all((ROOT / "k8s" / "mpijob-efficientdet-habana-style.yaml")
                                .read_text())
    pod = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    shell = pod["containers"][0]["command"]
    assert shell[:2] == ["/bin/bash", "-c"] and pod["terminationGracePeriodSeconds"] >= 60
    script = tmp_path / "rank.py"
    script.write_text(SIGNAL_REPORTER)
    with started([*shell, "--allow-run-as-root", "-np", "2", sys.executable, str(script),
                  str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        _wait_for_files(tmp_path, "ready-*", 2)
        process.send_signal(signal.SIGTERM)  # What Kubernetes sends the pod's first process.
        assert process.wait(timeout=60) == 143
    assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == ["SIGUSR2"] * 2


def _wait_for_files(directory, pattern, count, seconds=60):
    deadline = time.monotonic() + seconds
    while len(list(directory.glob(pattern))) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(directory.glob(pattern))) == count, sorted(os.listdir(directory))


@needs_mpirun
@pytest.mark.parametrize("signum, seen", [(signal.SIGTERM, "SIGUSR2"), (signal.SIGINT, "SIGUSR1"),
                                          (signal.SIGHUP, "SIGALRM")])
def test_the_launcher_passes_a_stop_signal_on_and_waits_for_the_ranks(tmp_path, signum, seen):
    """mpirun would abort on SIGTERM/SIGINT/SIGHUP: the ranks get the stand-in mpirun forwards
    (engine/preemption.py takes it as the original); the launcher waits for them and exits
    128 + the number of the signal it got."""
    script = tmp_path / "rank.py"
    script.write_text(SIGNAL_REPORTER)
    with started([sys.executable, str(LAUNCHER), "--use_horovod", "2", "--main_script",
                  str(script), str(tmp_path)], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as process:
        _wait_for_files(tmp_path, "ready-*", 2)
        process.send_signal(signum)
        assert process.wait(timeout=60) == 128 + signum
    assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == [seen] * 2


@needs_mpirun
def test_a_second_signal_to_the_launcher_ends_the_job_at_once(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(SIGNAL_REPORTER)
    with started([sys.executable, str(LAUNCHER), "--use_horovod", "2", "--main_script",
                  str(script), str(tmp_path), "hang"], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as process:
        _wait_for_files(tmp_path, "ready-*", 2)
        process.send_signal(signal.SIGTERM)
        _wait_for_files(tmp_path, "got-*", 2)  # The ranks took it and go on (a long step).
        time.sleep(processes.SAME_STOP_SECONDS)  # Sooner, it is the same stop sent twice.
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) != 0
        assert time.monotonic() - start < 10
