"""Which device a run computes on: HPU when Habana's module loads, else GPU when TensorFlow lists
one, else CPU; or the one --device requires, with an error naming what is missing."""
import tensorflow.compat.v1 as tf
from absl import logging

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.runtime import habana
from efficientdet_hpu.runtime import rank_logging

DEVICES = ('HPU', 'GPU', 'CPU')

_devices = {}        # (no_hpu, require) -> device chosen by select_device


class DeviceError(UserError, RuntimeError):
    """A device was requested with --device but this host cannot provide it."""


def _gpu_available():
    return bool(tf.config.list_physical_devices('GPU'))


def _absent(device, reason):
    return DeviceError('--device=%s was requested but %s — or drop the flag to run on CPU'
                       % (device, reason))


def _choose_required(device, no_hpu):
    """Returns `device` if this host has it, else raises DeviceError saying why not."""
    if device == 'HPU':
        if no_hpu:
            raise DeviceError('--device=HPU contradicts --no_hpu; drop one of the two flags')
        available, reason = habana.probe_hpu()
        if not available:
            raise _absent('HPU', reason)
    elif device == 'GPU' and not _gpu_available():
        raise _absent('GPU', "tf.config.list_physical_devices('GPU') is empty (a CUDA "
                      'build of tensorflow and an NVIDIA driver are needed)')
    return device


def _choose_default(no_hpu):
    """HPU when Habana's module loads, else GPU when TensorFlow lists one, else CPU. Inside
    Habana's stack without a usable Gaudi (no card, no driver) it says so in one line."""
    if not no_hpu:
        available, reason = habana.probe_hpu()
        if available:
            return 'HPU'
        if habana.installed():
            logging.warning('%sno Gaudi HPU: %s', rank_logging.rank_log_prefix(), reason)
    return 'GPU' if _gpu_available() else 'CPU'


def select_device(no_hpu: bool = False, require: str | None = None) -> str:
    """Returns 'HPU', 'GPU' or 'CPU' and logs the choice once per distinct call.

    Without `require`: HPU when habana_frameworks.tensorflow imports and load_habana_module()
    succeeds (skipped when `no_hpu`), else GPU when TensorFlow lists one, else CPU. Loading
    the Habana module makes TF place ops on the HPU, and habana_env_defaults() is applied
    (setdefault) only when that load succeeds. `require` ('hpu'/'gpu'/'cpu', any case) picks
    that device or raises DeviceError naming what is missing. Cached; same without Horovod.
    """
    wanted = None if require is None else str(require).upper()
    if wanted is not None and wanted not in DEVICES:
        raise ValueError('--device=%s is not a device; use one of %s' % (require, ', '.join(DEVICES)))
    key = (bool(no_hpu), wanted)
    if key not in _devices:
        if wanted is not None:
            device = _choose_required(wanted, no_hpu)
        else:
            device = _choose_default(no_hpu)
        _devices[key] = device
        logging.info('%sdevice: %s%s', rank_logging.rank_log_prefix(), device,
                     ' (HPU skipped: --no_hpu)' if no_hpu else '')
    return _devices[key]


def mixed_precision_dtype(device: str) -> str:
    """'float16' on GPU (the caller keeps losses in float32 and scales them), else 'bfloat16'."""
    device = str(device).upper()
    if device not in DEVICES:
        raise ValueError('unknown device %r; use one of %s' % (device, ', '.join(DEVICES)))
    return 'float16' if device == 'GPU' else 'bfloat16'
