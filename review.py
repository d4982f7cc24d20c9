"""`python review.py` runs efficientdet_hpu.cli.review
(the label review's command, beside finetune.py: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import run_or_alias

run_or_alias(__name__, 'efficientdet_hpu.cli.review')
