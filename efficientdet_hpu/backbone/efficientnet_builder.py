"""EfficientNet-B0..B7 and EfficientNet-Lite0..Lite4 as data: the B0 block table, the
compound-scaling coefficients and the rounding rules that turn them into per-block arguments
(Tan & Le, ICML 2019, Table 1 and section 3.3; coefficients and rounding as in the public TF
EfficientNet).

The Lite variants (TF EfficientNet's `lite/efficientnet_lite_builder`, used by google/automl's
EfficientDet-Lite) are the same table made edge-friendly: no squeeze-excitation, ReLU6 (the
caller's act_type; EfficientDet-Lite's config sets it), and a fixed stem and head: the stem's 32
filters and the first and last stages' repeats are not scaled. Their ImageNet weights expect
inputs normalised as (x - 127) / 128 (config/model_variants.py), not the B0-B7 mean/std.

`build_backbone` is the entry point EfficientDet uses: it returns the level 1-5 feature maps.
"""
import collections
import math
import re

from efficientdet_hpu.backbone import efficientnet_model

BlockArgs = collections.namedtuple('BlockArgs', [
    'kernel_size', 'num_repeat', 'input_filters', 'output_filters', 'expand_ratio',
    'strides', 'se_ratio', 'id_skip'])

# EfficientNet-B0 stages: r=repeats, k=kernel, s=stride, e=expansion, i/o=filters in/out,
# se=squeeze-excitation ratio (of the block's input filters).
B0_BLOCKS = (
    'r1_k3_s1_e1_i32_o16_se0.25',
    'r2_k3_s2_e6_i16_o24_se0.25',
    'r2_k5_s2_e6_i24_o40_se0.25',
    'r3_k3_s2_e6_i40_o80_se0.25',
    'r3_k5_s1_e6_i80_o112_se0.25',
    'r4_k5_s2_e6_i112_o192_se0.25',
    'r1_k3_s1_e6_i192_o320_se0.25',
)
STEM_FILTERS = 32
DEPTH_DIVISOR = 8

# name: (width_coefficient, depth_coefficient). The classifier's resolution and dropout are
# not carried: EfficientDet builds neither the head nor the dropout.
SCALING = {
    'efficientnet-b0': (1.0, 1.0),
    'efficientnet-b1': (1.0, 1.1),
    'efficientnet-b2': (1.1, 1.2),
    'efficientnet-b3': (1.2, 1.4),
    'efficientnet-b4': (1.4, 1.8),
    'efficientnet-b5': (1.6, 2.2),
    'efficientnet-b6': (1.8, 2.6),
    'efficientnet-b7': (2.0, 3.1),
    'efficientnet-lite0': (1.0, 1.0),
    'efficientnet-lite1': (1.0, 1.1),
    'efficientnet-lite2': (1.1, 1.2),
    'efficientnet-lite3': (1.2, 1.4),
    'efficientnet-lite4': (1.4, 1.8),
}
HEAD_FILTERS = 1280  # The ImageNet classifier's 1x1 conv (scaled for B0-B7, fixed for Lite).

# Stochastic depth inside EfficientDet, as google/automl builds it (efficientdet_arch.py
# build_backbone) and Habana's port keeps it: EfficientNet's default keep probability 0.8,
# except B0, whose drop-connect automl turns off.
DEFAULT_SURVIVAL_PROB = 0.8
NO_DROP_CONNECT = ('efficientnet-b0',)

_BLOCK_RE = re.compile(r'^r(\d+)_k(\d+)_s(\d+)_e(\d+)_i(\d+)_o(\d+)_se([\d.]+)(_noskip)?$')


def decode_block(text):
    """'r2_k3_s2_e6_i16_o24_se0.25' -> BlockArgs (strides as one int, same on both axes)."""
    match = _BLOCK_RE.match(text)
    if not match:
        raise ValueError('block string %r is not of the form r2_k3_s2_e6_i16_o24_se0.25' % text)
    repeat, kernel, stride, expand, filters_in, filters_out = map(int, match.groups()[:6])
    return BlockArgs(kernel_size=kernel, num_repeat=repeat, input_filters=filters_in,
                     output_filters=filters_out, expand_ratio=expand, strides=stride,
                     se_ratio=float(match.group(7)), id_skip=match.group(8) is None)


def round_filters(filters, width_coefficient, divisor=DEPTH_DIVISOR):
    """Scales a channel count and rounds it to a multiple of `divisor`, never below 90%."""
    scaled = filters * width_coefficient
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return int(rounded)


def is_lite(model_name):
    """True for 'efficientnet-lite0' .. 'efficientnet-lite4' (validates the name)."""
    scaling_coefficients(model_name)
    return model_name.startswith('efficientnet-lite')


def round_repeats(repeats, depth_coefficient):
    """Scales a stage's block count, rounding up."""
    return int(math.ceil(depth_coefficient * repeats))


def scaling_coefficients(model_name):
    """(width, depth) of 'efficientnet-bN'; unknown names list the valid."""
    if model_name not in SCALING:
        raise ValueError('unknown backbone %r; valid: %s' % (model_name, ', '.join(SCALING)))
    return SCALING[model_name]


def scaled_blocks(model_name):
    """One BlockArgs per block (repeats unrolled) of the scaled network, in order.

    Within a stage only the first block strides and changes width; the rest take the stage's
    output filters as input with stride 1. Lite: no SE, first and last stages not deepened,
    and the first block takes the unscaled stem's filters.
    """
    width, depth = scaling_coefficients(model_name)
    lite = is_lite(model_name)
    stages = list(map(decode_block, B0_BLOCKS))
    blocks = []
    for index, stage in enumerate(stages):
        fixed = lite and index in (0, len(stages) - 1)
        stage = stage._replace(
            input_filters=round_filters(stage.input_filters, width),
            output_filters=round_filters(stage.output_filters, width),
            num_repeat=stage.num_repeat if fixed else round_repeats(stage.num_repeat, depth),
            se_ratio=0.0 if lite else stage.se_ratio)
        if lite and index == 0:
            stage = stage._replace(input_filters=stem_filters(model_name))
        blocks.append(stage)
        blocks.extend([stage._replace(input_filters=stage.output_filters, strides=1)]
                      * (stage.num_repeat - 1))
    return blocks


def default_survival_prob(model_name):
    """The backbone's drop-connect keep probability in EfficientDet (None: off)."""
    scaling_coefficients(model_name)  # Validates the name.
    return None if model_name in NO_DROP_CONNECT else DEFAULT_SURVIVAL_PROB


def stem_filters(model_name):
    if is_lite(model_name):
        return STEM_FILTERS
    return round_filters(STEM_FILTERS, scaling_coefficients(model_name)[0])


def head_filters(model_name):
    """Filters of the ImageNet classifier's 1x1 head conv (not part of EfficientDet)."""
    if is_lite(model_name):
        return HEAD_FILTERS
    return round_filters(HEAD_FILTERS, scaling_coefficients(model_name)[0])


def build_backbone(images, model_name, norm_fn, act_type='swish', is_training=False,
                   survival_prob=None):
    """Builds the EfficientNet feature extractor (no head) under variable scope `model_name`.

    Args:
      images: [B, H, W, 3] in the compute dtype, normalised; H and W multiples of 32.
      model_name: 'efficientnet-b0' .. 'efficientnet-b7', 'efficientnet-lite0' .. 'lite4'.
      norm_fn: f(x, name, act_type=None) -> x, batch norm with its settings bound.
      act_type: activation after the stem, expansion and depthwise convs and inside SE.
      is_training: Python bool (drop-connect is active only when training).
      survival_prob: stochastic-depth keep probability of the last block (None: off).
    Returns:
      {level: [B, H / 2**level, W / 2**level, C_level]} for levels 1..5, in the input dtype.
    """
    return efficientnet_model.efficientnet_features(
        images, scaled_blocks(model_name), stem_filters(model_name), norm_fn=norm_fn,
        act_type=act_type, is_training=is_training, survival_prob=survival_prob,
        name=model_name)
