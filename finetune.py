"""`python finetune.py` runs efficientdet_hpu.cli.finetune
(a name its users type, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import run_or_alias

run_or_alias(__name__, 'efficientdet_hpu.cli.finetune')
