"""Multi-box jobs for real: demo_efficientdet.py's MULTI_HLS_IPS and --hostfile modes start
ranks over ssh on a second box (an sshd on 127.0.0.2, tests/ssh_hosts.py), train and evaluate;
and the faults of a cluster end in one line: a box that does not answer ssh or lacks the venv
(before any rank starts), a rank killed on the second box (the rerun resumes). A rank stopped
there or in a one-box job, which the stall time-out names: test_multibox_stalls.py (a file of
its own, so that the two slow halves run on both test workers).

The second box shares this machine's files, as boxes with a shared file system do, so
model_dir is "shared storage". A rank runs on the second box when its process was started
by that sshd: SSH_CONNECTION in its environment names 127.0.0.2.
"""
import json
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest

from cli_runs import REPO, assert_one_line_error, run_process, run_python, tiny_flags
from efficientdet_hpu.cli import demo_efficientdet as launcher
from efficientdet_hpu.launch import ClusterConfigError, LaunchError, heartbeat, network, ssh_preflight
from ssh_hosts import BARE_HOST, SECOND_HOST, UNREACHABLE_HOST, ssh_hosts  # noqa: F401
from test_train_and_eval import evaluate_alone, metrics

LAUNCHER = os.path.join(REPO, 'demo_efficientdet.py')
STEP_RE = re.compile(r'step (\d+)/\d+ loss')
CHECKSUM_RE = re.compile(r'\[\d+,(\d+)\]<std(?:out|err)>:.*final weights at step (\d+): '
                         r'checksum (\S+)')


# ---------------------------------------------------------------- the command, without running it

ECHO = os.path.join(REPO, 'tests', 'fixtures', 'echo_argv.py')
SSH_ARGS = '-i /keys/cluster -o StrictHostKeyChecking=accept-new'


def build(argv, **env):
    env = dict({'PATH': '/usr/bin:/bin'}, **env)
    return launcher.build_launch(['--main_script', ECHO] + argv, env, cores=4,
                                 deduce_network=lambda names: '10.9.0.0/16')


def option(command, name):
    return command[command.index(name) + 1]


def test_a_hostfile_names_the_boxes_and_ssh_reaches_them_with_mpi_ssh_args(tmp_path):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('box-1 slots=2  # first\nbox-2 slots=2\n')
    launch = build(['--hostfile', str(hostfile), '--model_dir=%s' % tmp_path],
                   DOCKER_SSHD_PORT='2200', MPI_SSH_ARGS=SSH_ARGS)
    command = launch.command
    assert option(command, '--hostfile') == str(hostfile) and option(command, '-np') == '4'
    assert option(command, 'plm_rsh_args') == '-p 2200 ' + SSH_ARGS
    assert launch.files == ((str(tmp_path / 'hcl_config_4.json'),
                             launcher.hccl_config.config_json(launch.hcl_config)),)
    assert launch.hcl_config['HCL_RANKS'] == ['box-1'] * 2 + ['box-2'] * 2
    # The pre-flight asks both boxes for this interpreter, the training script and orted.
    assert launch.preflight == ssh_preflight.Preflight(
        ('box-1', 'box-2'), ('-p', '2200', *SSH_ARGS.split()), sys.executable, (ECHO,), 'orted')
    heartbeat_dir, hosts, seconds = launch.stall_watch
    assert hosts == ['box-1', 'box-1', 'box-2', 'box-2'] and seconds == 300
    assert heartbeat_dir.startswith(str(tmp_path / 'heartbeat') + '/')
    assert launch.env['HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'] == '300'
    for name in ('HOROVOD_STALL_SHUTDOWN_TIME_SECONDS', 'EFFICIENTDET_HEARTBEAT_DIR'):
        assert command[command.index(name) - 1] == '-x'
    assert 'MPI_SSH_ARGS' not in command and 'DOCKER_SSHD_PORT' not in command


def test_bare_hostfile_lines_take_use_horovod_and_mpi_root_names_orted(tmp_path):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('box-1\nbox-2\n')
    mpi_root = tmp_path / 'openmpi'
    (mpi_root / 'bin').mkdir(parents=True)
    (mpi_root / 'bin' / 'mpirun').write_text('')
    launch = build(['--hostfile', str(hostfile), '--use_horovod', '3', '--model_dir=%s' % tmp_path],
                   MPI_ROOT=str(mpi_root))
    assert launch.hostfile_contents == 'box-1 slots=3\nbox-2 slots=3\n'
    assert option(launch.command, '--hostfile') == str(tmp_path / 'mpi_hostfile_6')
    assert option(launch.command, 'plm_rsh_args') == '-p 3022'
    assert launch.preflight.daemon == str(mpi_root / 'bin' / 'orted')


def test_one_box_has_no_preflight_and_watches_its_ranks_without_horovods_shutdown(tmp_path):
    launch = build(['--use_horovod', '2', '--model_dir=%s' % tmp_path])
    assert launch.preflight is None
    directory, hosts, seconds = launch.stall_watch
    assert launch.env['EFFICIENTDET_HEARTBEAT_DIR'] == directory
    assert not directory.startswith(str(tmp_path))  # local: the temporary folder
    assert len(hosts) == 2 and seconds == 300
    assert 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS' not in launch.env  # Horovod's left as it is
    off = build(['--use_horovod', '2', '--model_dir=%s' % tmp_path],
                HOROVOD_STALL_SHUTDOWN_TIME_SECONDS='0')
    assert off.stall_watch is None and 'EFFICIENTDET_HEARTBEAT_DIR' not in off.env
    alone = build(['--use_horovod', '1', '--model_dir=%s' % tmp_path])
    assert alone.stall_watch is None and alone.preflight is None


@pytest.mark.parametrize('env, shutdown, seconds', [
    ({'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '45'}, '45', 45),
    ({'HOROVOD_STALL_CHECK_TIME_SECONDS': '400'}, '400', 400),  # never below the check time
    ({'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '0'}, '0', None),  # off: no watch either
])
def test_the_stall_shutdown_time_is_the_users_or_on_by_default(tmp_path, env, shutdown, seconds):
    launch = build(['--use_horovod', '1', '--model_dir=%s' % tmp_path],
                   MULTI_HLS_IPS='box-1,box-2', **env)
    assert launch.env['HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'] == shutdown
    assert (launch.stall_watch and launch.stall_watch[2]) == seconds


@pytest.mark.parametrize('argv, env, error, message', [
    (['--hostfile', 'H'], {'MULTI_HLS_IPS': 'a,b'}, LaunchError, 'unset MULTI_HLS_IPS or drop'),
    (['--kubernetes_run', '--hostfile', 'H'], {}, LaunchError, 'drop --hostfile'),
    (['--hostfile', '/nonexistent'], {}, ClusterConfigError, "'/nonexistent' cannot be read"),
    (['--use_horovod', '1'], {'MULTI_HLS_IPS': 'a,b', 'MPI_SSH_ARGS': "-i 'unclosed"},
     ClusterConfigError, 'does not parse'),
    (['--use_horovod', '1'], {'MULTI_HLS_IPS': 'a,b', 'MPI_SSH_ARGS': "-i '/my keys/k'"},
     ClusterConfigError, 'holds a space'),
    (['--use_horovod', '1'], {'MULTI_HLS_IPS': 'a,b', 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS': '1m'},
     ClusterConfigError, 'not a number of seconds'),
])
def test_bad_multi_box_settings_name_the_input(argv, env, error, message):
    with pytest.raises(error, match=re.escape(message)):
        build(argv, **env)


def test_the_remote_check_names_what_is_missing():
    command = ssh_preflight.remote_check('/venv/bin/python', ('/repo/main.py',), 'orted')
    assert command == ('test -x /venv/bin/python || echo missing: /venv/bin/python; '
                       'test -f /repo/main.py || echo missing: /repo/main.py; '
                       'command -v orted >/dev/null || echo missing: orted')
    assert ssh_preflight.ssh_command('box', ('-p', '22'), 'true') == [
        'ssh', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5', '-p', '22', 'box', 'true']
    assert ssh_preflight.is_this_box('localhost') and ssh_preflight.is_this_box('127.0.0.1')
    assert not ssh_preflight.is_this_box(SECOND_HOST)


def test_boxes_on_other_loopback_addresses_talk_over_lo():
    """127.0.0.2 is another box for Open MPI, reached over lo; 127.0.0.1 is this one."""
    assert network.deduce_tcp_include(['127.0.0.1', SECOND_HOST]) == '127.0.0.0/8'


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def beat(directory, rank, text):
    (directory / ('rank.%d' % rank)).write_text(text)


def test_the_stall_watch_names_the_rank_whose_heartbeat_stopped(tmp_path):
    clock = Clock()
    watch = heartbeat.StallWatch(str(tmp_path), ['box-1', 'box-2'], 60, clock=clock)
    assert watch.check() is None  # no rank has beaten yet: nothing to judge
    beat(tmp_path, 0, '1 100 box-1\n')
    beat(tmp_path, 1, '1 200 box-2\n')
    assert watch.check() is None
    clock.now = 59.0
    beat(tmp_path, 0, '30 100 box-1\n')
    assert watch.check() is None
    clock.now = 60.0
    stall = watch.check()
    assert stall == heartbeat.Stall(1, 'box-2', '200', 60.0)
    assert heartbeat.stall_line(stall, 2).startswith(
        'rank 1 of 2 (on box-2, pid 200) has not answered for 60 s')
    beat(tmp_path, 1, 'done 200\n')  # a rank that ended normally is no stall
    clock.now = 500.0
    beat(tmp_path, 0, '31 100 box-1\n')
    assert watch.check() is None


# ---------------------------------------------------------------- real boxes over ssh


def launch(args, env, timeout):
    """The launcher as a user runs it; (CompletedProcess, seconds)."""
    started = time.monotonic()
    result = run_process([sys.executable, LAUNCHER] + list(args), timeout, env=env)
    return result, time.monotonic() - started


def two_box_env(ssh_hosts, **extra):  # pylint: disable=redefined-outer-name
    return ssh_hosts.env(MULTI_HLS_IPS='127.0.0.1,%s' % SECOND_HOST, **extra)


def process_env(pid):
    try:
        with open('/proc/%d/environ' % pid, 'rb') as stream:
            items = stream.read().split(b'\0')
        with open('/proc/%d/cmdline' % pid, 'rb') as stream:
            cmdline = stream.read().decode(errors='replace')
    except OSError:
        return None, ''
    env = dict(item.decode(errors='replace').split('=', 1) for item in items if b'=' in item)
    return env, cmdline


def ranks_of(model_dir):
    """{rank: (pid, address the rank's sshd listened on or None)} of the ranks training into
    model_dir, found in /proc: a remote rank is a child of its box's orted, not the launcher's."""
    ranks = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        env, cmdline = process_env(int(entry))
        if env and 'OMPI_COMM_WORLD_RANK' in env and model_dir in cmdline:
            connection = env.get('SSH_CONNECTION', '').split()
            ranks[int(env['OMPI_COMM_WORLD_RANK'])] = (
                int(entry), connection[2] if len(connection) == 4 else None)
    return ranks


def checkpointed_step(model_dir):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the fast tests need none)
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit('-', 1)[1]) if latest else 0


def act_on_second_box_rank(model_dir, signum, done, after_step=1, seconds=600,
                           host=SECOND_HOST):
    """In a thread: once a checkpoint of `after_step` or later exists, sends `signum` (0: none)
    to the rank running on `host` (None: rank 1 of a one-box job) and records {'pid', 'at'} in
    `done` (left empty if that never happens within `seconds`)."""
    def run():
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if checkpointed_step(model_dir) >= after_step:
                remote = [pid for rank, (pid, where) in ranks_of(model_dir).items()
                          if where == host and (host is not None or rank == 1)]
                if remote:
                    os.kill(remote[0], signum)
                    done.update(pid=remote[0], at=time.monotonic())
                    return
            time.sleep(0.2)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def end_process(pid):
    """SIGCONT and SIGKILL to `pid` if it is still there (a test's leftover)."""
    for signum in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return


PROBE = """import json, os, sys
rank = os.environ['OMPI_COMM_WORLD_RANK']
with open(os.path.join(sys.argv[1], 'rank-%s.json' % rank), 'w') as stream:
    json.dump(dict(os.environ), stream)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hostfile_job_gives_the_second_box_only_the_forwarded_environment(ssh_hosts, tmp_path):  # noqa: F811
    hostfile = tmp_path / 'hostfile'
    hostfile.write_text('# two boxes\n127.0.0.1 slots=1\n%s slots=1\n' % SECOND_HOST)
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    env = ssh_hosts.env(NOT_FOR_RANKS='x', TF_ENABLE_ONEDNN_OPTS='0')
    result, _ = launch(['--hostfile', str(hostfile), '--main_script', str(probe), str(tmp_path),
                        '--model_dir=%s' % (tmp_path / 'model')], env, 100)
    assert result.returncode == 0, result.stdout
    assert '--hostfile %s ' % hostfile in result.stdout  # used as written: every line has slots=
    remote = json.loads((tmp_path / 'rank-1.json').read_text())
    assert remote['SSH_CONNECTION'].split()[2:] == [SECOND_HOST, str(ssh_hosts.port)]
    assert 'NOT_FOR_RANKS' not in remote and 'MPI_SSH_ARGS' not in remote
    for name in ('PATH', 'TF_ENABLE_ONEDNN_OPTS', 'PYTHONUNBUFFERED', 'HCL_CONFIG_PATH',
                 'EFFICIENTDET_HEARTBEAT_DIR'):
        assert remote[name] == env.get(name, remote[name]), name
    assert remote['HCL_CONFIG_PATH'] == str(tmp_path / 'model' / 'hcl_config_2.json')
    # The launcher turns Horovod's stall shutdown on for many boxes and forwards it.
    assert remote['HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'] == '300'


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unreachable_boxes_are_named_before_any_rank_starts(ssh_hosts, tmp_path):  # noqa: F811
    """127.0.0.3 refuses the connection; 127.0.0.5 accepts it and never speaks (a box that
    hangs): both named in one line within ssh's ConnectTimeout, nothing written, no rank."""
    with socket.socket() as silent:
        silent.bind(('127.0.0.5', ssh_hosts.port))
        silent.listen(8)
        env = ssh_hosts.env(MULTI_HLS_IPS='127.0.0.1,%s,%s,127.0.0.5'
                            % (SECOND_HOST, UNREACHABLE_HOST))
        model_dir = tmp_path / 'model'
        result, seconds = launch(['--use_horovod', '1', '--model_dir=%s' % model_dir], env, 120)
    line = assert_one_line_error(result, 'no rank started', UNREACHABLE_HOST, '127.0.0.5',
                                 'port %d' % ssh_hosts.port, 'DOCKER_SSHD_PORT',
                                 starts_with='demo_efficientdet.py: error:')
    assert SECOND_HOST not in line.split('fix:')[0]
    assert seconds < 20, seconds
    assert 'running: mpirun' not in result.stdout
    assert not model_dir.exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_box_without_the_venv_is_named_before_any_rank_starts(ssh_hosts, tmp_path):  # noqa: F811
    env = ssh_hosts.env(MULTI_HLS_IPS='127.0.0.1,%s' % BARE_HOST)
    result, _ = launch(['--use_horovod', '1', '--model_dir=%s' % (tmp_path / 'model')], env, 120)
    assert_one_line_error(result, 'no rank started', '%s lacks %s' % (BARE_HOST, ssh_hosts.hidden),
                          'same paths')
    assert not (tmp_path / 'model').exists()


TOTAL_STEPS = 6  # 2 steps per epoch x 3 epochs: still running when step 2 is checkpointed.


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_boxes_train_and_evaluate_and_a_killed_rank_ends_the_job_the_rerun_resumes(
        ssh_hosts, tiny_dataset, tmp_path):  # noqa: F811
    """Habana's multi-box command (MULTI_HLS_IPS, one rank per box; --hostfile: above): the rank
    on the second box killed after the first checkpoint ends the job; the same command again
    resumes from that checkpoint on both boxes, trains and evaluates to the end, as a separate
    evaluation of its last checkpoint does. One job for both halves: a second box's job is the
    suite's costliest start."""
    model_dir = str(tmp_path / 'model')
    flags = ['--use_horovod', '1'] + tiny_flags(
        tiny_dataset, model_dir, '--mode=train_and_eval', '--num_examples_per_epoch=8',
        '--num_epochs=%d' % (TOTAL_STEPS // 2), '--cp_every_n_steps=2')
    killed = {}
    killer = act_on_second_box_rank(model_dir, signal.SIGKILL, killed)
    result, _ = launch(flags, two_box_env(ssh_hosts), 700)
    ended = time.monotonic()
    killer.join(timeout=10)
    # A rank ran on the second box (a process of its sshd), reached with the launcher's ssh args.
    assert killed, 'no rank on %s was killed: %s' % (SECOND_HOST, result.stdout[-4000:])
    assert "plm_rsh_args '-p %d -i " % ssh_hosts.port in result.stdout
    assert result.returncode != 0, result.stdout[-4000:]
    assert ended - killed['at'] < 60, 'the job took %.0f s to end' % (ended - killed['at'])
    killed_at = checkpointed_step(model_dir)
    assert 0 < killed_at < TOTAL_STEPS

    result, _ = launch(flags, two_box_env(ssh_hosts), 700)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    latest = os.path.join(model_dir, 'model.ckpt-%d' % killed_at)
    assert 'resuming from %s (step %d)' % (latest, killed_at) in output, output[-4000:]
    steps = [int(step) for step in STEP_RE.findall(output)]
    assert steps and min(steps) > killed_at and max(steps) == TOTAL_STEPS, steps
    final = {int(rank): (int(step), checksum) for rank, step, checksum in CHECKSUM_RE.findall(output)}
    assert sorted(final) == [0, 1] and final[0] == final[1], output[-4000:]
    assert final[0][0] == TOTAL_STEPS, output[-4000:]
    # Evaluation is distributed (each rank its shard), in the training session, scored once by
    # rank 0; its metrics equal a separate `--mode=eval` of that checkpoint under mpirun.
    assert re.search(r'train_and_eval: evaluations at steps [0-9, and]*%d, in the training '
                     r'session' % TOTAL_STEPS, output), output[-4000:]
    assert len([line for line in output.splitlines() if 'wall time ' in line]) == 1  # Rank 0's.
    last = 'model.ckpt-%d' % TOTAL_STEPS
    assert re.search(r'\[1,1\]<std(out|err)>:.*\[rank 1/2\] evaluating %s' % last, output)
    assert ('[1,0]<stdout>:COCO evaluation of %s (step %d, 8 images)' % (last, TOTAL_STEPS)
            in output), output[-4000:]
    # Checkpoints and the log come from rank 0 only: the rerun's records, each once.
    with open(os.path.join(model_dir, 'train_log.jsonl')) as stream:
        records = [(record['event'], record['step']) for record in map(json.loads, stream)]
    rerun = [record for record in records if record[1] > killed_at]
    assert len(rerun) == len(set(rerun)) and rerun[-2:] == [
        ('eval', TOTAL_STEPS), ('wall_time', TOTAL_STEPS)], records
    assert checkpointed_step(model_dir) == TOTAL_STEPS
    alone = evaluate_alone(model_dir, TOTAL_STEPS, tmp_path, lambda copy: run_python(
        ['demo_efficientdet.py', '--use_horovod', '2'] + tiny_flags(
            tiny_dataset, copy, '--mode=eval', '--num_examples_per_epoch=8',
            '--num_epochs=%d' % (TOTAL_STEPS // 2), '--eval_timeout=1', '--min_eval_interval=0'),
        timeout=900))
    assert alone == metrics(model_dir, TOTAL_STEPS)
    # Heartbeats are removed with the job.
    assert not os.listdir(os.path.join(model_dir, 'heartbeat'))
