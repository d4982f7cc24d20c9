"""Reads a PyTorch state dict saved in the legacy (pre-1.6) serialisation, without torch.

Such a `.pth` file is five pickles in a row, then the raw storages:
  1. the magic number 0x1950a86a20f9469cfc6c   2. the protocol version 1001
  3. system info {'little_endian': ..., 'type_sizes': ...}
  4. the state dict: an OrderedDict of tensors, each `torch._utils._rebuild_tensor_v2(storage,
     offset, size, stride, requires_grad, backward_hooks)`, whose storage is a persistent id
     ('storage', torch.FloatStorage, key, location, numel[, view metadata])
  5. the list of storage keys, in the order their bytes follow
and, per key, an int64 little-endian element count followed by that many elements.

Safety: the pickles are read by an unpickler that resolves only the globals such files use
(ALLOWED_GLOBALS: the tensor-rebuild function, OrderedDict and the torch.*Storage types) and
refuses any other with UnsafePickleError naming it, so reading a file never runs its code.
Nothing here imports torch; tensors come back as NumPy arrays in their original layout
(a conv weight is [out, in, kh, kw]).
"""
import collections
import pickle
import struct

import numpy as np

from efficientdet_hpu.core.errors import UserError

MAGIC_NUMBER = 0x1950a86a20f9469cfc6c
PROTOCOL_VERSION = 1001

# torch.<name>Storage -> NumPy dtype (little endian, as these files are written on x86/ARM).
STORAGE_DTYPES = {
    'FloatStorage': '<f4', 'DoubleStorage': '<f8', 'HalfStorage': '<f2',
    'LongStorage': '<i8', 'IntStorage': '<i4', 'ShortStorage': '<i2', 'CharStorage': 'i1',
    'ByteStorage': 'u1', 'BoolStorage': '?',
}
REBUILD_TENSOR = ('torch._utils', '_rebuild_tensor_v2')
ALLOWED_GLOBALS = frozenset([REBUILD_TENSOR, ('collections', 'OrderedDict')]
                            + [('torch', name) for name in STORAGE_DTYPES])


class TorchFileError(UserError, ValueError):
    """A .pth file that is not a legacy torch state dict (or is damaged)."""


class UnsafePickleError(TorchFileError):
    """The file's pickle names a global outside ALLOWED_GLOBALS."""


class StorageType:
    """Stands for torch.<name>Storage inside the pickle."""

    def __init__(self, name):
        self.name = name
        self.dtype = np.dtype(STORAGE_DTYPES[name])


class _PendingTensor:
    """A tensor whose storage bytes come after the pickles."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, offset
        self.size, self.stride = tuple(size), tuple(stride)


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, *extra):
    del requires_grad, hooks, extra
    return _PendingTensor(storage, offset, size, stride)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file, encoding='latin1')
        self._path = path
        self.storages = {}  # key -> (StorageType, numel)

    def find_class(self, module, name):
        if (module, name) not in ALLOWED_GLOBALS:
            raise UnsafePickleError(
                '%s: refused to read: its pickle names %s.%s, which a torch state dict does not '
                'need (allowed: %s); only load weight files from sources you trust'
                % (self._path, module, name,
                   ', '.join(sorted('%s.%s' % pair for pair in ALLOWED_GLOBALS))))
        if (module, name) == REBUILD_TENSOR:
            return _rebuild_tensor
        if module == 'collections':
            return collections.OrderedDict
        return StorageType(name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == 'storage'
                and isinstance(pid[1], StorageType)):
            raise TorchFileError('%s: unexpected persistent id %r (not a legacy torch '
                                 'storage)' % (self._path, pid[:2] if isinstance(pid, tuple)
                                               else type(pid).__name__))
        _, storage_type, key, _, numel = pid[:5]
        if len(pid) > 5 and pid[5] is not None:
            raise TorchFileError('%s: storage views are not supported' % self._path)
        self.storages[str(key)] = (storage_type, int(numel))
        return str(key)


def _load_one(file, path, unpickler=None):
    unpickler = unpickler or _RestrictedUnpickler(file, path)
    try:
        return unpickler.load()
    except (TorchFileError, MemoryError):
        raise
    except Exception as error:  # A truncated or non-pickle file: one line, not a traceback.
        raise TorchFileError('%s is not a legacy PyTorch .pth file (%s: %s)'
                             % (path, type(error).__name__, error))


def _read_storages(file, path, storages, keys):
    """{key: 1-D array} read from the raw section, in the order `keys` lists them."""
    arrays = {}
    for key in keys:
        storage_type, numel = storages[str(key)]
        header = file.read(8)
        if len(header) != 8:
            raise TorchFileError('%s is truncated (storage %s missing)' % (path, key))
        (count,) = struct.unpack('<q', header)
        nbytes = count * storage_type.dtype.itemsize
        data = file.read(nbytes)
        if count != numel or len(data) != nbytes:
            raise TorchFileError('%s is truncated or damaged (storage %s: %d of %d elements)'
                                 % (path, key, len(data) // storage_type.dtype.itemsize, numel))
        arrays[str(key)] = np.frombuffer(data, storage_type.dtype)
    return arrays


def _materialise(tensor, arrays, path, name):
    flat = arrays[tensor.storage]
    itemsize = flat.dtype.itemsize
    if not tensor.size:  # A 0-d tensor (e.g. BN's num_batches_tracked).
        return np.array(flat[tensor.offset])
    end = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride)) + 1
    if min(tensor.size) > 0 and end > flat.size:
        raise TorchFileError('%s: tensor %s reaches past its storage' % (path, name))
    view = np.lib.stride_tricks.as_strided(
        flat[tensor.offset:], shape=tensor.size,
        strides=[s * itemsize for s in tensor.stride], writeable=False)
    return np.array(view)


def read_state_dict(path):
    """{name: np.ndarray} of a legacy-format PyTorch state dict, in the file's order.

    Raises TorchFileError (a zip-format file of torch >= 1.6, a damaged file) or
    UnsafePickleError (a global other than ALLOWED_GLOBALS); both are one-line UserErrors.
    """
    try:
        file = open(path, 'rb')
    except OSError as error:
        raise TorchFileError('cannot read %s: %s' % (path, error.strerror))
    with file:
        if file.read(2) == b'PK':
            raise TorchFileError('%s is a zip-format torch file (torch >= 1.6); only the legacy '
                                 'format is read: re-save it with torch.save(state_dict, path, '
                                 '_use_new_zipfile_serialization=False)' % path)
        file.seek(0)
        if _load_one(file, path) != MAGIC_NUMBER:
            raise TorchFileError('%s is not a legacy PyTorch .pth file (no magic number)' % path)
        if _load_one(file, path) != PROTOCOL_VERSION:
            raise TorchFileError('%s: unsupported torch protocol version' % path)
        info = _load_one(file, path)
        if not isinstance(info, dict) or not info.get('little_endian', False):
            raise TorchFileError('%s: only little-endian files are read' % path)
        unpickler = _RestrictedUnpickler(file, path)
        state = _load_one(file, path, unpickler)
        keys = _load_one(file, path)
        if not isinstance(state, dict) or not isinstance(keys, list):
            raise TorchFileError('%s does not hold a state dict (name -> tensor)' % path)
        arrays = _read_storages(file, path, unpickler.storages, keys)
    result = collections.OrderedDict()
    for name, tensor in state.items():
        if not isinstance(tensor, _PendingTensor):
            raise TorchFileError('%s: entry %r is not a tensor' % (path, name))
        result[name] = _materialise(tensor, arrays, path, name)
    return result
