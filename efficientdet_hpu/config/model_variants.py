"""The EfficientDet variants as one table of their scaling fields only; every other field is
a default of hparams_config (google/automl's efficientdet hparams_config for the content)."""

# Only the scaling fields differ between variants (paper Table 1; D7x from the automl README).
MODEL_VARIANTS = {
    'efficientdet-d0': dict(backbone_name='efficientnet-b0', image_size=512,
                            fpn_num_filters=64, fpn_cell_repeats=3, box_class_repeats=3),
    'efficientdet-d1': dict(backbone_name='efficientnet-b1', image_size=640,
                            fpn_num_filters=88, fpn_cell_repeats=4, box_class_repeats=3),
    'efficientdet-d2': dict(backbone_name='efficientnet-b2', image_size=768,
                            fpn_num_filters=112, fpn_cell_repeats=5, box_class_repeats=3),
    'efficientdet-d3': dict(backbone_name='efficientnet-b3', image_size=896,
                            fpn_num_filters=160, fpn_cell_repeats=6, box_class_repeats=4),
    'efficientdet-d4': dict(backbone_name='efficientnet-b4', image_size=1024,
                            fpn_num_filters=224, fpn_cell_repeats=7, box_class_repeats=4),
    'efficientdet-d5': dict(backbone_name='efficientnet-b5', image_size=1280,
                            fpn_num_filters=288, fpn_cell_repeats=7, box_class_repeats=4),
    'efficientdet-d6': dict(backbone_name='efficientnet-b6', image_size=1280,
                            fpn_num_filters=384, fpn_cell_repeats=8, box_class_repeats=5,
                            fpn_weight_method='sum'),
    'efficientdet-d7': dict(backbone_name='efficientnet-b6', image_size=1536,
                            fpn_num_filters=384, fpn_cell_repeats=8, box_class_repeats=5,
                            anchor_scale=5.0, fpn_weight_method='sum'),
    'efficientdet-d7x': dict(backbone_name='efficientnet-b7', image_size=1536,
                             fpn_num_filters=384, fpn_cell_repeats=8, box_class_repeats=5,
                             anchor_scale=4.0, max_level=8, fpn_weight_method='sum'),
}
