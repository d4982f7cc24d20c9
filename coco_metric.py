"""`import coco_metric` gives efficientdet_hpu.evaluation.coco_metric
(a name its users import, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import alias

alias(__name__, 'efficientdet_hpu.evaluation.coco_metric')
