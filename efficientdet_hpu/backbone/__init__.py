"""EfficientNet backbones for EfficientDet: `efficientnet_builder` (block table, B0-B7 scaling,
`build_backbone`) and `efficientnet_model` (the layers)."""
