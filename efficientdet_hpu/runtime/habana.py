"""The Habana (Gaudi) stack: the environment defaults of Habana's port and loading Habana's
TensorFlow module, once per process. The only module that imports habana_frameworks."""
import glob
import importlib.util
import os
import sys

_probe_result = None  # (available, reason) after the first probe


def habana_env_defaults() -> dict:
    """Environment knobs of Habana's TF EfficientDet port (Model-References), for setdefault.

    HOROVOD_CYCLE_TIME=0.5: its main.py sets it, if absent, before hvd.init() (which reads it).
    LOG_LEVEL_ALL=6: its hb_configs/*.yaml set it to silence Synapse runtime logging.
    Left out: TF_BF16_CONVERSION (the port casts in the model via use_bfloat16 instead of
    Habana's bf16 graph pass, as we do with mixed_precision_dtype); HABANA_NCCL_COMM_API=0
    (in one old revision of its main.py; unverified for SynapseAI 1.14); a TPC-fuser switch
    (its README says the fuser is disabled but names no variable; we do not guess one).
    """
    return {'HOROVOD_CYCLE_TIME': '0.5', 'LOG_LEVEL_ALL': '6'}


# Where the habanalabs kernel driver shows itself (a container sees the host's /sys and the
# device nodes it was given): its module, and the device nodes of 1.x releases (accel, hl).
DRIVER_PATHS = ('/sys/module/habanalabs', '/dev/accel/accel*', '/dev/hl[0-9]*')


def driver_present() -> bool:
    """True when the habanalabs driver is loaded or a Gaudi device node is visible."""
    return any(glob.glob(pattern) for pattern in DRIVER_PATHS)


def probe_hpu():
    """Imports habana_frameworks and loads its TF module once; returns (ok, reason).

    Without the driver nothing is loaded: load_habana_module() fails there half-way, after
    registering Habana's op library, and TensorFlow then aborts in Synapse's shim at the first
    dataset op (seen with habana-tensorflow 1.14.0.493 on a CPU machine)."""
    global _probe_result
    if _probe_result is not None:
        return _probe_result
    if installed() and not driver_present():
        _probe_result = (False, 'no habanalabs driver on this host (none of %s): no Gaudi '
                         'visible, so Habana\'s module is not loaded' % ', '.join(DRIVER_PATHS))
        return _probe_result
    try:
        from habana_frameworks.tensorflow import load_habana_module  # pylint: disable=g-import-not-at-top
    except ImportError as err:
        missing = isinstance(err, ModuleNotFoundError) and (err.name or '').startswith('habana')
        _probe_result = (False, 'habana_frameworks.tensorflow is %s (pip install -r requirements-hpu.txt'
                      ' on a Gaudi host)' % ('not installed' if missing else 'broken: %s' % err))
        return _probe_result
    applied = {k: v for k, v in habana_env_defaults().items() if k not in os.environ}
    os.environ.update(applied)  # setdefault semantics; must precede load_habana_module()
    try:
        load_habana_module()
        _probe_result = (True, '')
    except Exception as err:  # pylint: disable=broad-except  # no card, driver or wrong TF
        for key in applied:  # not on an HPU after all: leave the environment as it was
            os.environ.pop(key, None)
        _probe_result = (False, 'load_habana_module() failed: %s: %s (is the habanalabs driver '
                      'loaded and a Gaudi visible? see hl-smi)' % (type(err).__name__, err))
    return _probe_result


def installed() -> bool:
    """True when habana_frameworks is importable (Habana's stack), Gaudi or not."""
    if 'habana_frameworks' in sys.modules:  # loaded, or a stand-in without a spec
        return True
    return importlib.util.find_spec('habana_frameworks') is not None


def probed() -> bool:
    """True once probe_hpu() has run in this process (the Habana module loads before
    hvd.init(), so ranks.init() checks this order)."""
    return _probe_result is not None
