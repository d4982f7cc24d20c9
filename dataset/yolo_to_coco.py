"""`python -m dataset.yolo_to_coco` runs efficientdet_hpu.datatools.yolo_to_coco
(next to the converter it feeds: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import run_or_alias

run_or_alias(__name__, 'efficientdet_hpu.datatools.yolo_to_coco')
