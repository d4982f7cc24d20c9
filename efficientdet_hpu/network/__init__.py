"""The network: the BiFPN topology as data (fpn_configs) and EfficientDet (efficientdet_arch)."""
