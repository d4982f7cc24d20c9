"""checkpoints/weight_files.py: what a weights flag names, told from generated files of each
kind (real TF checkpoints, a real SavedModel and HDF5 file, torch files in both of torch's
layouts written without torch, an Ultralytics-like .pt), and main.py refusing a wrong one in
one line before it builds a graph."""
import os

import h5py
import numpy as np
import pytest
import tensorflow as tf

from cli_runs import assert_one_line_error, run_main, tiny_flags
from efficientdet_hpu.checkpoints import warm_start
from efficientdet_hpu.checkpoints import weight_files
from torch_legacy_fixtures import write_legacy_pth
from weight_fixtures import (lite0_state, write_legacy_lite, write_ultralytics_pt,
                             write_zip_state_dict)

tf1 = tf.compat.v1
DETECTOR_NAMES = ('box_net/box-predict/bias', 'class_net/class-predict/bias',
                  'efficientnet-lite0/stem/conv2d/kernel', 'global_step',
                  'resample_p6/conv2d/kernel')


def _checkpoint(prefix, names):
    return warm_start.write_name_checkpoint({name: np.zeros(2, np.float32) for name in names},
                                            str(prefix))


def _model_dir(directory, names=DETECTOR_NAMES):
    directory.mkdir()
    prefix = _checkpoint(directory / 'model.ckpt-30', names)
    tf1.train.update_checkpoint_state(str(directory), prefix)
    return str(directory)


def _refusal(flag, path):
    with pytest.raises(weight_files.WeightFileError) as raised:
        weight_files.check(flag, str(path))
    return str(raised.value)


def test_torch_files_are_told_apart_by_their_names_without_loading_them(tmp_path):
    lite = write_legacy_lite(str(tmp_path / 'efficientnet-lite0-57934424.pth'))
    found = weight_files.check('weights', lite)
    assert (found.kind, found.role, found.what) == (
        'torch-legacy', 'backbone', 'an EfficientNet-Lite state dict in PyTorch\'s legacy format')
    assert weight_files.check('backbone_ckpt', lite).role == 'backbone'
    assert _refusal('ckpt', lite) == (
        '--ckpt=%s is an EfficientNet-Lite state dict in PyTorch\'s legacy format; pass it as '
        '--backbone_ckpt; accepted: %s' % (lite, weight_files.ACCEPTED['ckpt']))
    zipped = write_zip_state_dict(str(tmp_path / 'lite0-new.pth'), lite0_state())
    assert _refusal('weights', zipped) == (
        '--weights=%s is an EfficientNet-Lite state dict in PyTorch\'s zip format (torch >= '
        '1.6), which is not read: re-save it with torch.save(state_dict, path, '
        '_use_new_zipfile_serialization=False); accepted: %s'
        % (zipped, weight_files.ACCEPTED['weights']))
    yolo = write_ultralytics_pt(str(tmp_path / 'best.pt'))
    assert _refusal('weights', yolo).startswith(
        '--weights=%s is an Ultralytics YOLO model (ultralytics.nn.tasks.DetectionModel) in '
        'PyTorch\'s zip format (torch >= 1.6), another architecture whose weights do not fit '
        'EfficientDet; accepted: an EfficientNet-Lite ImageNet .pth' % yolo)
    other = write_zip_state_dict(str(tmp_path / 'resnet.pth'),
                                 {'conv1.weight': np.zeros(2, np.float32),
                                  'layer1.0.bn1.bias': np.zeros(2, np.float32)})
    assert 'a PyTorch file of another model in PyTorch\'s zip format (torch >= 1.6) (names ' \
           'like conv1.weight, layer1.0.bn1.bias)' in _refusal('weights', other)
    se = dict(lite0_state(), **{'_blocks.1._se_reduce.weight': np.zeros(2, np.float32)})
    write_legacy_pth(str(tmp_path / 'b0.pth'), se)
    assert 'an EfficientNet-B state dict (squeeze-and-excitation blocks) in PyTorch\'s legacy ' \
           'format, not EfficientNet-Lite' in _refusal('backbone_ckpt', tmp_path / 'b0.pth')


class _Runs:
    """A global a malicious pickle would call; sniffing never calls it."""

    def __reduce__(self):
        return (os.system, ('touch /tmp/should-never-exist-%d' % os.getpid(),))


def test_a_pickle_naming_other_code_is_refused_and_never_run(tmp_path):
    path = str(tmp_path / 'evil.pth')
    write_legacy_pth(path, {'w': np.zeros(2, np.float32)}, extra=_Runs())
    assert ('whose pickle names %s.system, not a state dict of tensors (refused to read: '
            'loading it would run that code)' % os.system.__module__) in _refusal('weights', path)
    assert not os.path.exists('/tmp/should-never-exist-%d' % os.getpid())


def test_tf_checkpoints_model_dirs_and_exports(tmp_path):
    run = _model_dir(tmp_path / 'run')
    found = weight_files.check('ckpt', run)
    assert (found.kind, found.role, found.path) == ('tf-checkpoint', 'detector',
                                                    os.path.join(run, 'model.ckpt-30'))
    assert found.what == 'an EfficientDet detector\'s TF checkpoint (the model_dir\'s latest, ' \
                         'model.ckpt-30)'
    # The prefix, or one of its files named by mistake, is the same checkpoint.
    for named in ('model.ckpt-30', 'model.ckpt-30.index', 'model.ckpt-30.data-00000-of-00001'):
        assert weight_files.check('weights', os.path.join(run, named)).path == found.path
    index = os.path.join(run, 'model.ckpt-30.index')
    with pytest.raises(weight_files.WeightFileError, match=r'is a file of the TF checkpoint .*'
                                                           r'model.ckpt-30: pass its prefix, '
                                                           r'--ckpt=.*model.ckpt-30$'):
        weight_files.check('ckpt', index, exact=True)  # main.py passes the path on as it is.
    assert _refusal('backbone_ckpt', run).startswith(
        '--backbone_ckpt=%s is an EfficientDet detector\'s TF checkpoint (the model_dir\'s '
        'latest, model.ckpt-30); pass it as --ckpt; accepted:' % run)
    backbone = _checkpoint(tmp_path / 'efficientnet-b0' / 'model.ckpt',
                           ['efficientnet-b0/stem/conv2d/kernel', 'global_step'])
    assert weight_files.check('backbone_ckpt', backbone).role == 'backbone'
    assert 'pass it as --backbone_ckpt' in _refusal('ckpt', backbone)
    resnet = _checkpoint(tmp_path / 'resnet' / 'model.ckpt', ['resnet_v1_50/conv1/weights'])
    assert 'is a TF checkpoint of another model (variable scopes resnet_v1_50)' in _refusal(
        'weights', resnet)
    (tmp_path / 'loose').mkdir()
    _checkpoint(tmp_path / 'loose' / 'model.ckpt-7', DETECTOR_NAMES)
    assert 'is a folder of TF checkpoints without a `checkpoint` index file; name one: %s' % (
        tmp_path / 'loose' / 'model.ckpt-7') in _refusal('ckpt', tmp_path / 'loose')
    exported = str(tmp_path / 'export')
    tf.saved_model.save(tf.Module(), exported)
    assert _refusal('weights', exported).startswith(
        '--weights=%s is a SavedModel (an export: no training variables to start from); pass '
        'the model_dir it was exported from; accepted:' % exported)


def test_other_files_and_random_bytes(tmp_path):
    with h5py.File(str(tmp_path / 'yolo.h5'), 'w') as stream:
        stream['w'] = np.zeros(2)
    assert 'is a Keras HDF5 file; accepted' in _refusal('weights', tmp_path / 'yolo.h5')
    noise = tmp_path / 'weights.pth'
    noise.write_bytes(np.random.RandomState(0).bytes(4096))
    assert _refusal('weights', noise).startswith(
        '--weights=%s is not a weights file this project reads (it starts with b' % noise)
    assert _refusal('ckpt', tmp_path / 'absent').startswith(
        '--ckpt=%s is not there; accepted: a detector\'s TF checkpoint' % (tmp_path / 'absent'))
    (tmp_path / 'photos').mkdir()
    (tmp_path / 'photos' / 'a.jpg').write_bytes(b'')
    assert 'is a folder holding no checkpoint (a.jpg)' in _refusal('weights', tmp_path / 'photos')


@pytest.mark.slow  # main.py imports TensorFlow: about 15 s.
def test_main_refuses_a_wrong_warm_start_before_building_a_graph(tmp_path, tiny_dataset):
    yolo = write_ultralytics_pt(str(tmp_path / 'best.pt'))
    result = run_main(tiny_flags(tiny_dataset, tmp_path / 'run', '--mode=train',
                                 '--ckpt=' + yolo), timeout=300)
    assert_one_line_error(result, '--ckpt=%s is an Ultralytics YOLO model' % yolo,
                          starts_with='main.py: error:')
    assert 'efficientdet-' not in result.stdout.split('main.py: error:')[0]  # No run summary yet.
