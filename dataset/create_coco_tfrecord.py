"""`python -m dataset.create_coco_tfrecord` runs efficientdet_hpu.datatools.create_coco_tfrecord
(a name its users type, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import run_or_alias

run_or_alias(__name__, 'efficientdet_hpu.datatools.create_coco_tfrecord')
