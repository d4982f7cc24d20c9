"""`python -m dataset.verify_tfrecords` runs efficientdet_hpu.datatools.verify_tfrecords
(a name its users type, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import run_or_alias

run_or_alias(__name__, 'efficientdet_hpu.datatools.verify_tfrecords')
