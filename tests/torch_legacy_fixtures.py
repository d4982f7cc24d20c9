"""Writes PyTorch state dicts in the legacy (pre-1.6) `.pth` serialisation without torch, the
way torch.save(..., _use_new_zipfile_serialization=False) lays them out: five pickles (magic
number, protocol version, system info, the state dict with persistent storage ids, the storage
keys), then each storage as an int64 element count and its raw little-endian bytes.

The pickle must name torch's globals (torch._utils._rebuild_tensor_v2, torch.FloatStorage);
pickle resolves a global through sys.modules, so stand-in modules `torch` and `torch._utils`
are installed only while the state dict is pickled, and removed again.
"""
import collections
import contextlib
import pickle
import struct
import sys
import types

import numpy as np

MAGIC_NUMBER = 0x1950a86a20f9469cfc6c
STORAGE_NAMES = {np.dtype('float32'): 'FloatStorage', np.dtype('int64'): 'LongStorage'}


def _rebuild_tensor_v2(*args):
    raise AssertionError('only pickled here, never called')


class Storage:
    """A flat array standing for one torch storage."""

    def __init__(self, key, array):
        self.key, self.array = key, np.ascontiguousarray(array).reshape(-1)


class Tensor:
    """A view (offset, size, stride in elements) of a Storage, pickled as torch pickles it."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def __reduce__(self):
        return (_rebuild_tensor_v2, (self.storage, self.offset, tuple(self.size),
                                     tuple(self.stride), False, collections.OrderedDict()))


def contiguous(storage, shape, offset=0):
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return Tensor(storage, offset, shape, strides)


@contextlib.contextmanager
def standing_in(modules):
    """Puts {name: module} into sys.modules for the block, then what was there back."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def _stand_in_torch():
    """Module objects named torch and torch._utils with what torch.save pickles by name."""
    torch, utils = types.ModuleType('torch'), types.ModuleType('torch._utils')
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = 'torch._utils', '_rebuild_tensor_v2'
    for name in STORAGE_NAMES.values():
        setattr(torch, name, type(name, (), {'__module__': 'torch', '__qualname__': name}))
    torch._utils = utils
    with standing_in({'torch': torch, 'torch._utils': utils}):
        yield torch


class _Pickler(pickle.Pickler):
    def __init__(self, file, torch):
        super().__init__(file, protocol=2)
        self.torch, self.storages = torch, {}

    def persistent_id(self, obj):
        if not isinstance(obj, Storage):
            return None
        self.storages[obj.key] = obj
        storage_type = getattr(self.torch, STORAGE_NAMES[obj.array.dtype])
        return ('storage', storage_type, obj.key, 'cpu', obj.array.size, None)


def write_legacy_pth(path, state, extra=None):
    """Writes {name: Tensor | np.ndarray} (arrays get a storage of their own) as a legacy .pth.
    `extra` is pickled as one more state-dict entry as it is (e.g. a foreign global)."""
    entries = collections.OrderedDict()
    for index, (name, value) in enumerate(state.items()):
        if isinstance(value, np.ndarray):
            value = contiguous(Storage('s%d' % index, value), list(value.shape))
        entries[name] = value
    if extra is not None:
        entries['extra'] = extra
    with open(path, 'wb') as f, _stand_in_torch() as torch:
        for header in (MAGIC_NUMBER, 1001, {'protocol_version': 1001, 'little_endian': True,
                                            'type_sizes': {'short': 2, 'int': 4, 'long': 4}}):
            pickle.dump(header, f, protocol=2)
        pickler = _Pickler(f, torch)
        pickler.dump(entries)
        keys = sorted(pickler.storages)
        pickle.dump(keys, f, protocol=2)
        for key in keys:
            array = pickler.storages[key].array
            f.write(struct.pack('<q', array.size))
            f.write(array.astype(array.dtype.newbyteorder('<')).tobytes())
