"""Weight files of the kinds users pass by mistake, written without torch or Ultralytics:
PyTorch's zip format (torch >= 1.6: archive/data.pkl, archive/data/<storage key>,
archive/version), holding an EfficientNet-Lite state dict or an Ultralytics-like YOLO model
object (its class from a stand-in `ultralytics.nn.tasks` module, as torch.save pickles the
model itself), and a legacy .pth of Lite names (tests/torch_legacy_fixtures.py)."""
import contextlib
import io
import json
import os
import types
import zipfile

import numpy as np

import torch_legacy_fixtures as legacy

HERE = os.path.dirname(os.path.abspath(__file__))
LITE0_NAMES = os.path.join(HERE, 'fixtures', 'efficientnet_lite0_pth_names.json')


def lite0_state(count=12):
    """The first `count` names of the real efficientnet-lite0-57934424.pth with tiny arrays
    (the names are what tells the file apart; the shapes do not matter here)."""
    with open(LITE0_NAMES) as stream:
        names = [name for name, _, _ in json.load(stream)[:count]]
    return {name: np.zeros(2, np.float32) for name in names}


def write_legacy_lite(path, count=12):
    legacy.write_legacy_pth(path, lite0_state(count))
    return path


@contextlib.contextmanager
def _stand_in_ultralytics():
    tasks = types.ModuleType('ultralytics.nn.tasks')
    tasks.DetectionModel = type('DetectionModel', (), {'__module__': 'ultralytics.nn.tasks'})
    with legacy.standing_in({'ultralytics': types.ModuleType('ultralytics'),
                             'ultralytics.nn': types.ModuleType('ultralytics.nn'),
                             'ultralytics.nn.tasks': tasks}):
        yield tasks


def _zip(path, pickled, storages):
    with zipfile.ZipFile(path, 'w') as archive:
        archive.writestr('archive/data.pkl', pickled)
        archive.writestr('archive/version', '3\n')
        for key, array in storages.items():
            archive.writestr('archive/data/%s' % key, array.tobytes())
    return path


def write_zip_state_dict(path, state):
    """{name: array} in torch's zip layout (tensors by persistent storage id, as torch)."""
    entries = {name: legacy.contiguous(legacy.Storage(str(index), value), list(value.shape))
               for index, (name, value) in enumerate(state.items())}
    stream = io.BytesIO()
    with legacy._stand_in_torch() as torch:  # pylint: disable=protected-access
        pickler = legacy._Pickler(stream, torch)  # pylint: disable=protected-access
        pickler.dump(entries)
    return _zip(path, stream.getvalue(),
                {key: storage.array for key, storage in pickler.storages.items()})


def write_ultralytics_pt(path):
    """What `yolo train` saves (best.pt): a dict whose 'model' is the pickled DetectionModel."""
    import pickle  # pylint: disable=import-outside-toplevel
    with _stand_in_ultralytics() as tasks:
        model = tasks.DetectionModel()
        model.yaml = {'nc': 80, 'backbone': [[-1, 1, 'Conv', [64, 3, 2]]]}
        pickled = pickle.dumps({'epoch': -1, 'best_fitness': None, 'model': model,
                                'train_args': {'model': 'yolov8n.pt', 'data': 'coco8.yaml'}},
                               protocol=2)
    return _zip(path, pickled, {})
