"""`import hparams_config` gives efficientdet_hpu.config.hparams_config
(a name its users import, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import alias

alias(__name__, 'efficientdet_hpu.config.hparams_config')
