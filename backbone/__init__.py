"""automl's `backbone.efficientnet_builder` / `backbone.efficientnet_model` names (the code is
efficientdet_hpu.backbone)."""
