"""`import backbone.efficientnet_model` gives efficientdet_hpu.backbone.efficientnet_model
(a name its users import, kept at the root: efficientdet_hpu/core/compat.py)."""
from efficientdet_hpu.core.compat import alias

alias(__name__, 'efficientdet_hpu.backbone.efficientnet_model')
