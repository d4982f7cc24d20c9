"""The EfficientDet variants as one table of their scaling fields only; every other field is
a default of hparams_config (google/automl's efficientdet hparams_config for the content).

EfficientDet-Lite0..Lite4 (automl's `efficientdet_lite_param_dict`) add what their
EfficientNet-Lite backbones were trained with: ReLU6 everywhere, plain-sum BiFPN fusion and the
inception-style input normalisation (x - 127) / 128, which their ImageNet weights expect.
"""

# automl's lite_common_param (mean_rgb=127, stddev_rgb=128, act relu6, fusion 'sum').
LITE_MEAN_RGB = [127.0, 127.0, 127.0]
LITE_STDDEV_RGB = [128.0, 128.0, 128.0]
_LITE = dict(act_type='relu6', fpn_weight_method='sum', mean_rgb=LITE_MEAN_RGB,
             stddev_rgb=LITE_STDDEV_RGB)

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
    # Lite: anchor_scale 3.0 except Lite3 and Lite4, which keep the default 4.0 (as automl).
    'efficientdet-lite0': dict(backbone_name='efficientnet-lite0', image_size=320,
                               fpn_num_filters=64, fpn_cell_repeats=3, box_class_repeats=3,
                               anchor_scale=3.0, **_LITE),
    'efficientdet-lite1': dict(backbone_name='efficientnet-lite1', image_size=384,
                               fpn_num_filters=88, fpn_cell_repeats=4, box_class_repeats=3,
                               anchor_scale=3.0, **_LITE),
    'efficientdet-lite2': dict(backbone_name='efficientnet-lite2', image_size=448,
                               fpn_num_filters=112, fpn_cell_repeats=5, box_class_repeats=3,
                               anchor_scale=3.0, **_LITE),
    'efficientdet-lite3': dict(backbone_name='efficientnet-lite3', image_size=512,
                               fpn_num_filters=160, fpn_cell_repeats=6, box_class_repeats=4,
                               **_LITE),
    'efficientdet-lite3x': dict(backbone_name='efficientnet-lite3', image_size=640,
                                fpn_num_filters=200, fpn_cell_repeats=6, box_class_repeats=4,
                                anchor_scale=3.0, **_LITE),
    'efficientdet-lite4': dict(backbone_name='efficientnet-lite4', image_size=640,
                               fpn_num_filters=224, fpn_cell_repeats=7, box_class_repeats=4,
                               **_LITE),
}
