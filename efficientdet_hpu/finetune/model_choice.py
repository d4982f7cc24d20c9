"""Which network a fine-tune trains: the variant (from the request, the weights, the
hardware), from random weights its activation, and the network of the search's start from
random weights. Pure, as finetune/plan.py, which uses it."""
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import stats as stats_lib

DEFAULT_MODEL = 'efficientdet-lite0'
ACCELERATOR_MODEL = 'efficientdet-lite2'
ACCELERATOR_MIN_IMAGES = 1000
# The search's start from random weights beside an ImageNet backbone (finetune/search.py):
# D0 with configs/demo.yaml's narrower BiFPN and heads, on D0's levels 3-7. At 128 px on
# classes-20 it trained as fast as Lite0 with swish (38 against 37 images/s) and reached AP50
# 0.26-0.28 at step 1,200 in three runs (two on the demo's levels 3-5), Lite0 0.11 and 0.23
# (docs/dev/history.md).
RANDOM_START_MODEL = 'efficientdet-d0'
RANDOM_START_NETWORK = (('fpn_num_filters', 48), ('fpn_cell_repeats', 2),
                        ('box_class_repeats', 2))
# Its anchor_scale at least configs/demo.yaml's. On shapes-300 at 128 px the doctor's 1.5 reaches
# 75% of the boxes (Lite0's 3.0: 32%), and the same 2,510-step schedule trained to AP50 0.708
# with 2.0 against 0.666 with 1.5; on deepforest's tiles Lite0's own 3.0 (92%) beat the
# doctor's 1.875 (97%) by 0.04-0.07 (docs/dev/history.md).
RANDOM_START_MIN_ANCHOR_SCALE = 2.0
# And its levels 3-5 where the boxes fit them: the same schedule with 2.0 reached AP50 0.727
# on levels 3-5 against 0.708 on D0's 3-7, and trained 5% faster (35.0 against 33.2 images/s).
# A box fits when a same-centred square anchor of level 5 overlaps it by IoU >= 0.5: sqrt(w h)
# at most sqrt(2) times the level's largest anchor (anchor_scale x 2^5 x 2^(2/3)); 99 boxes in
# 100 must.
RANDOM_START_LEVELS = (3, 5)
FIT_PERCENTILE = 99


def choose_model(request, data, hardware, table=None) -> tuple:
    """(model name, why)."""
    if request.model_name:
        return request.model_name, 'asked with --model_name'
    if request.weights.model_name:
        return request.weights.model_name, 'the model of --weights=%s' % request.weights.path
    if hardware.accelerator and len(data.train) >= ACCELERATOR_MIN_IMAGES:
        return ACCELERATOR_MODEL, ('%s found and %d photos: a larger model has the data and the '
                                   'speed to pay off' % (hardware.accelerator, len(data.train)))
    table = table or costs.load()
    return DEFAULT_MODEL, ('%s: the fastest variant that fine-tunes from ImageNet weights '
                           '(%.1f images/s at 320 px here, D0 %.1f at 512)'
                           % ('no GPU or HPU found' if not hardware.accelerator
                              else 'under %d photos' % ACCELERATOR_MIN_IMAGES,
                              table.images_per_second(DEFAULT_MODEL, 320, hardware.cores)[0],
                              table.images_per_second('efficientdet-d0', 512,
                                                      hardware.cores)[0]))


def activation_keys(model, request) -> tuple:
    """(network hparams, why): swish for a Lite model from random weights. ReLU6 is Lite's for
    its ImageNet weights (trained with it) and for int8 accelerators; from random weights
    (docs/dev/history.md) Lite0 at 128 px reached AP50 0.050 with ReLU6 and 0.198 with swish
    on classes-20 (1,000 steps), 0.367 and 0.531 on few-grey-50 (600 steps)."""
    if request.weights.kind or not model.startswith('efficientdet-lite'):
        return (), ''
    if request.hparam('act_type') is not None:
        return (), ''
    return (('act_type', 'swish'),), (
        'swish in place of %s\'s ReLU6: random weights, so nothing holds it to ReLU6 (its '
        'ImageNet weights and int8 accelerators do); from random weights ReLU6 reached AP50 '
        '0.050 against swish\'s 0.198 on twenty classes of shapes, 0.367 against 0.531 on 50 '
        'grey photos (docs/finetune.md)' % model)


def _levels(request, scale, sides):
    """(keys, why) of RANDOM_START_LEVELS where the boxes (sqrt(w h) at the input) fit them."""
    if request.hparam('min_level') is not None or request.hparam('max_level') is not None:
        return [], ''
    top = RANDOM_START_LEVELS[1]
    octaves = request.hparam('num_scales') or hparams_config.get_efficientdet_config(
        RANDOM_START_MODEL).num_scales
    # The top level's largest anchor (its last octave), which a square box up to sqrt(2)
    # times its side still meets at IoU 0.5.
    largest = scale * 2 ** top * 2 ** ((octaves - 1) / float(octaves)) * 2 ** 0.5
    side = stats_lib.percentile(sides, FIT_PERCENTILE)
    if side > largest:
        return [], ''
    return [('min_level', RANDOM_START_LEVELS[0]), ('max_level', top)], (
        '; levels %d-%d, configs/demo.yaml\'s: %d boxes in 100 are at most %.0f px at the input '
        '(sqrt(w h)), which level %d\'s anchors reach' % (
            RANDOM_START_LEVELS[0], top, FIT_PERCENTILE, side, top))


def random_start_network(request, model, anchors, sides=()) -> tuple:
    """(model, (network hparams, ''), why, anchors, anchors note) of the search's start from
    random weights beside `model`: RANDOM_START_NETWORK, and RANDOM_START_LEVELS where the
    boxes' `sides` (sqrt(w h) at the input) fit them; a key --hparams names stays the user's.
    Its anchors are the doctor's `anchors`, checked with `model`'s (without an anchor_scale
    among them, `model`'s own), with an anchor_scale of at least RANDOM_START_MIN_ANCHOR_SCALE:
    a smaller one of the doctor's leaves `anchors` for the network hparams, the note saying
    so."""
    keys = [(key, value) for key, value in RANDOM_START_NETWORK if request.hparam(key) is None]
    why = ('%s with configs/demo.yaml\'s narrower BiFPN and heads (%s): from random weights it '
           'learns faster than %s at the same speed (docs/finetune.md)' % (
               RANDOM_START_MODEL, ', '.join('%s=%s' % item for item in keys) or
               'as --hparams sets them', model))
    advised = dict(anchors).get('anchor_scale')
    own = hparams_config.get_efficientdet_config(model).anchor_scale
    scale = max(own if advised is None else advised, RANDOM_START_MIN_ANCHOR_SCALE)
    levels, levels_why = _levels(request, request.hparam('anchor_scale') or scale, sides)
    keys, why = keys + levels, why + levels_why
    if request.hparam('anchor_scale') is not None or (
            advised is not None and advised >= RANDOM_START_MIN_ANCHOR_SCALE):
        return RANDOM_START_MODEL, (tuple(keys), ''), why, tuple(anchors), ''
    keys.append(('anchor_scale', scale))
    note = ''
    if advised is not None:
        note = ('anchor_scale %s, configs/demo.yaml\'s, in place of the data doctor\'s %s: '
                'from random weights a smaller scale reached more boxes and trained worse '
                '(docs/finetune.md)' % (scale, advised))
    else:  # No model's own anchor_scale is below RANDOM_START_MIN_ANCHOR_SCALE.
        why += '; anchor_scale %s, %s\'s, whose anchors the data doctor checked' % (scale, model)
    return RANDOM_START_MODEL, (tuple(keys), ''), why, tuple(
        item for item in anchors if item[0] != 'anchor_scale'), note
