"""Tests of distributed.py: single-process behaviour in-process, two workers under a real mpirun."""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from cli_runs import run_process
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.runtime import devices, distributed, habana, ranks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PROBE = os.path.join(REPO, 'tests', 'fixtures', 'runtime_probe.py')
LAUNCHER_VARS = ('OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'PMI_SIZE', 'PMI_RANK',
                 'MV2_COMM_WORLD_SIZE', 'PMIX_RANK', 'SLURM_NTASKS')


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    return env


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    """Each test starts as a new single process: no launcher vars, no cached choices."""
    saved_env = dict(os.environ)
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ranks, '_hvd', None)
    monkeypatch.setattr(ranks, '_init_done', False)
    monkeypatch.setattr(devices, '_devices', {})
    monkeypatch.setattr(habana, '_probe_result', None)
    monkeypatch.setattr(habana, 'driver_present', lambda: True)  # the stand-ins act as a Gaudi host
    yield
    os.environ.clear()
    os.environ.update(saved_env)


def _fake_habana(monkeypatch, load):
    """Installs a stand-in habana_frameworks.tensorflow whose load_habana_module is `load`."""
    package = types.ModuleType('habana_frameworks')
    module = types.ModuleType('habana_frameworks.tensorflow')
    module.load_habana_module = load
    package.tensorflow = module
    monkeypatch.setitem(sys.modules, 'habana_frameworks', package)
    monkeypatch.setitem(sys.modules, 'habana_frameworks.tensorflow', module)


# ----------------------------------------------------------------------------- one process

def test_single_process_identity():
    distributed.init()
    assert (distributed.rank(), distributed.size()) == (0, 1)
    assert (distributed.local_rank(), distributed.local_size()) == (0, 1)
    assert distributed.is_main() and not distributed.is_distributed()
    assert distributed.rank_log_prefix() == ''


@pytest.mark.slow  # A Python process importing TensorFlow.
def test_init_without_launcher_does_not_start_horovod():
    code = ('import sys; from efficientdet_hpu.runtime import distributed, ranks; distributed.init(); '
            'distributed.init(use_horovod=None); '
            'assert not distributed.is_distributed(); assert ranks._hvd is None; '
            "assert 'horovod.tensorflow' not in sys.modules; print('ok')")
    out = run_process([sys.executable, '-c', code], timeout=120, env=_clean_env(), cwd=REPO,
                      stderr=subprocess.PIPE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith('ok')


def test_init_with_horovod_missing_names_the_install_step(monkeypatch):
    monkeypatch.setitem(sys.modules, 'horovod', None)  # makes `import horovod.x` fail
    monkeypatch.setitem(sys.modules, 'horovod.tensorflow', None)
    with pytest.raises(ImportError, match=r'tools/setup_env\.sh.*requirements-hpu\.txt'):
        distributed.init(use_horovod=True)


def test_launcher_world_size_reads_each_launcher(monkeypatch):
    assert ranks.launcher_world_size() == 1
    monkeypatch.setenv('PMIX_RANK', '0')
    monkeypatch.setenv('SLURM_NTASKS', '3')
    assert ranks.launcher_world_size() == 3
    monkeypatch.setenv('PMI_SIZE', '2')
    assert ranks.launcher_world_size() == 2
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '4')
    assert ranks.launcher_world_size() == 4


def test_select_device_is_cpu_here():
    assert distributed.select_device() == 'CPU'
    assert distributed.select_device() == 'CPU'  # cached
    assert distributed.select_device(no_hpu=True) == 'CPU'
    assert distributed.select_device(require='cpu') == 'CPU'


def test_require_hpu_without_habana_says_how_to_fix():
    with pytest.raises(distributed.DeviceError) as info:
        distributed.select_device(require='HPU')
    message = str(info.value)
    assert message.startswith('--device=HPU was requested but habana_frameworks.tensorflow '
                              'is not installed')
    assert 'pip install -r requirements-hpu.txt on a Gaudi host' in message
    assert message.endswith('or drop the flag to run on CPU')


def test_require_gpu_without_gpu_and_bad_names():
    with pytest.raises(distributed.DeviceError, match=r'--device=GPU was requested but'):
        distributed.select_device(require='gpu')
    with pytest.raises(ValueError, match=r'HPU, GPU, CPU'):
        distributed.select_device(require='TPU')
    with pytest.raises(distributed.DeviceError, match=r'contradicts --no_hpu'):
        distributed.select_device(no_hpu=True, require='hpu')


def test_hpu_chosen_when_habana_loads_and_env_defaults_applied(monkeypatch):
    calls = []
    _fake_habana(monkeypatch, lambda: calls.append('load'))
    monkeypatch.setenv('HOROVOD_CYCLE_TIME', '2.0')  # the user's value wins (setdefault)
    monkeypatch.delenv('LOG_LEVEL_ALL', raising=False)
    assert distributed.select_device() == 'HPU'
    assert distributed.select_device(require='hpu') == 'HPU'
    assert calls == ['load']  # loaded once
    assert os.environ['HOROVOD_CYCLE_TIME'] == '2.0'
    assert os.environ['LOG_LEVEL_ALL'] == distributed.habana_env_defaults()['LOG_LEVEL_ALL']


def test_no_hpu_never_loads_habana(monkeypatch):
    calls = []
    _fake_habana(monkeypatch, lambda: calls.append('load'))
    assert distributed.select_device(no_hpu=True) == 'CPU'
    assert calls == []


def test_failed_habana_load_falls_back_and_leaves_env_alone(monkeypatch):
    def fail():
        raise RuntimeError('no Gaudi device found')
    _fake_habana(monkeypatch, fail)
    for name in distributed.habana_env_defaults():
        monkeypatch.delenv(name, raising=False)
    assert distributed.select_device() == 'CPU'
    assert not set(distributed.habana_env_defaults()) & set(os.environ)
    with pytest.raises(distributed.DeviceError, match=r'load_habana_module\(\) failed: RuntimeError'):
        distributed.select_device(require='HPU')


def test_habana_stack_without_a_gaudi_says_so_in_one_line(monkeypatch, caplog):
    def fail():
        raise RuntimeError('no Gaudi device found')
    _fake_habana(monkeypatch, fail)
    with caplog.at_level('WARNING'):
        assert distributed.select_device() == 'CPU'
        assert distributed.select_device(no_hpu=True) == 'CPU'
    (line,) = [r.getMessage() for r in caplog.records if 'Gaudi' in r.getMessage()]
    assert line.startswith('no Gaudi HPU: load_habana_module() failed: RuntimeError: no Gaudi '
                           'device found'), line


def test_habana_stack_without_the_driver_is_never_loaded(monkeypatch, caplog):
    calls = []
    _fake_habana(monkeypatch, lambda: calls.append('load'))
    monkeypatch.setattr(habana, 'driver_present', lambda: False)
    with caplog.at_level('WARNING'):
        assert distributed.select_device() == 'CPU'
    assert calls == []
    (line,) = [r.getMessage() for r in caplog.records if 'Gaudi' in r.getMessage()]
    assert line.startswith('no Gaudi HPU: no habanalabs driver on this host'), line


def test_no_habana_stack_no_gaudi_line(caplog):
    with caplog.at_level('WARNING'):
        assert distributed.select_device() == 'CPU'
    assert not [r for r in caplog.records if 'Gaudi' in r.getMessage()]


def test_horovod_missing_for_ranks_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'horovod', None)
    monkeypatch.setitem(sys.modules, 'horovod.tensorflow', None)
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '2')
    with pytest.raises(UserError, match=r'^Horovod is needed \(the MPI launcher started 2 ranks\)'):
        distributed.init()


def test_mixed_precision_dtype():
    assert distributed.mixed_precision_dtype('CPU') == 'bfloat16'
    assert distributed.mixed_precision_dtype('HPU') == 'bfloat16'
    assert distributed.mixed_precision_dtype('GPU') == 'float16'
    assert distributed.mixed_precision_dtype('gpu') == 'float16'
    with pytest.raises(ValueError, match='TPU'):
        distributed.mixed_precision_dtype('TPU')


def test_helpers_are_passthroughs_in_one_process():
    distributed.init()
    with tf.Graph().as_default():
        tensor = tf.constant([[1.0, 2.0]])
        gradients = [tensor, None]
        assert distributed.allreduce_gradients(gradients) == gradients
        assert distributed.broadcast_hook() == []
        assert distributed.allreduce_mean(tensor) is tensor
    array = np.arange(3)
    gathered = distributed.allgather_numpy(array)
    assert len(gathered) == 1 and gathered[0] is array
    payload = {'a': 1}
    assert distributed.broadcast_object(payload) is payload


@pytest.mark.slow  # A Python process importing TensorFlow.
def test_main_rank_writes_log_file(tmp_path):
    # absl sends everything to stderr until flags are parsed, as absl.app.run() does in main.py.
    code = ('from efficientdet_hpu.runtime import distributed; from absl import flags, logging; '
            'flags.FLAGS(["main"]); '
            'logging.set_verbosity(logging.INFO); distributed.configure_logging(log_dir=%r); '
            'logging.info("probe-line")' % str(tmp_path))
    out = run_process([sys.executable, '-c', code], timeout=120, env=_clean_env(), cwd=REPO,
                      stderr=subprocess.PIPE)
    assert out.returncode == 0, out.stderr
    texts = [p.read_text() for p in tmp_path.iterdir() if p.is_file()]
    assert any('probe-line' in text for text in texts), texts


# ----------------------------------------------------------------------------- two workers

@pytest.fixture(scope='module')
def two_ranks(tmp_path_factory):
    """Runs the probe on 2 workers; returns ({rank: result}, combined output)."""
    out_dir = tmp_path_factory.mktemp('probe')
    cmd = ['mpirun', '--allow-run-as-root', '-np', '2', sys.executable, PROBE, str(out_dir)]
    proc = run_process(cmd, timeout=120, env=_clean_env(), cwd=REPO, stderr=subprocess.PIPE)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    results = {}
    for rank in (0, 1):
        with open(out_dir / ('rank%d.json' % rank)) as f:
            results[rank] = json.load(f)
    return results, output


def test_two_ranks_identity(two_ranks):
    results, _ = two_ranks
    for rank, result in results.items():
        assert result['rank'] == rank and result['size'] == 2
        assert result['is_main'] == (rank == 0) and result['is_distributed']
        assert (result['local_rank'], result['local_size']) == (rank, 2)
        assert result['device'] == 'CPU'
        # On a GPU box each rank would see only its own GPU (automl issue 427: all on GPU 0).
        assert result['gpu_visible_devices'] == str(rank) and result['gpu_allow_growth']
    assert results[0]['prefix'] == '' and results[1]['prefix'] == '[rank 1/2] '


def test_broadcast_hook_copies_rank0_variables(two_ranks):
    results, _ = two_ranks
    for result in results.values():
        assert result['marker_after_broadcast'] == 10.0       # rank 0's 10 + 0, not 10 + 1
        assert result['weights_after_broadcast'] == [1.0, 2.0]


def test_allreduce_mean(two_ranks):
    results, _ = two_ranks
    for result in results.values():
        np.testing.assert_allclose(result['allreduce_mean'], 0.5, rtol=1e-5)
        assert result['allreduce_mean_bf16'] == 0.5


def test_positives_normaliser_per_rank_or_averaged_as_positives_momentum_says(two_ranks):
    results, _ = two_ranks
    for rank, result in results.items():
        # positives_momentum 0: automl's per-replica count + 1; < 0: the mean count over the
        # ranks (3.5) + 1 / 2 ranks, one process's count + 1 shared out.
        assert result['positives_normalizers'] == [rank + 4.0, 4.0]


def test_allreduce_gradients_averages_gradients(two_ranks):
    results, _ = two_ranks
    # rank r's gradient is (r + 1) * [1, 3]: mean [1.5, 4.5]; w = [1, 2] - 0.1 * mean.
    expected = [1.0 - 0.1 * 1.5, 2.0 - 0.1 * 4.5]
    assert results[0]['weights_after_step'] == results[1]['weights_after_step']
    np.testing.assert_allclose(results[0]['weights_after_step'], expected, rtol=1e-5)


def test_synchronised_batch_norm_equals_one_process_on_the_concatenated_batch(two_ranks):
    """Under a real mpirun -np 2, each rank normalises its own batch with the moments of
    both: the outputs are those of one process normalising the two batches together, and
    both ranks' moving averages move to the same values."""
    sys.path.insert(0, os.path.dirname(PROBE))
    import runtime_probe  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.ops import nn_layers  # pylint: disable=import-outside-toplevel
    results, _ = two_ranks
    batches = [runtime_probe.bn_batch(rank) for rank in (0, 1)]
    together = np.concatenate(batches)
    with tf.Graph().as_default(), tf.Session() as session:
        single = nn_layers.batch_norm(tf.constant(together), is_training=True,
                                      momentum=runtime_probe.BN_MOMENTUM, name='single')
        session.run(tf.global_variables_initializer())
        expected = session.run(single)
    mean, variance = together.mean(axis=(0, 1, 2)), together.var(axis=(0, 1, 2))
    assert not np.allclose(batches[0].mean(axis=(0, 1, 2)), mean, atol=0.1)  # Shards differ.
    for rank, result in results.items():
        size = len(batches[rank])
        np.testing.assert_allclose(result['sync_bn_output'],
                                   expected[rank * size:(rank + 1) * size], atol=1e-5)
        # moving <- 0.5 * initial (0 and 1) + 0.5 * the global batch moments (biased variance).
        np.testing.assert_allclose(result['sync_bn_moving_mean'], 0.5 * mean, rtol=1e-5)
        np.testing.assert_allclose(result['sync_bn_moving_variance'], 0.5 + 0.5 * variance,
                                   rtol=1e-5)
    assert results[0]['sync_bn_moving_mean'] == results[1]['sync_bn_moving_mean']


def test_python_object_collectives(two_ranks):
    results, _ = two_ranks
    for result in results.values():
        assert result['allgather_numpy'] == [[0, 1], [0, 2, 4]]
        assert result['allgather_numpy_dtypes'] == ['int64', 'int64']
        assert result['broadcast_root0'] == {'sender': 0, 'tag': 'r0'}
        assert result['broadcast_root1'] == ['sender', 1]


def test_non_main_log_lines_are_rank_tagged(two_ranks):
    _, output = two_ranks
    assert '[rank 1/2] device: CPU' in output
    assert output.count('[rank 1/2] probe: tf.compat.v1.logging line') == 1  # not duplicated
    assert '[rank 1/2] probe: absl line' in output
    assert '[rank 0/2]' not in output
