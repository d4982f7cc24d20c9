"""Which network a fine-tune trains: the variant (from the request, the weights, the
hardware), from random weights its activation, and the network of the search's start from
random weights. Pure, as finetune/plan.py, which uses it."""
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.finetune import costs

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


def random_start_network(request, model, anchors) -> tuple:
    """(model, (network hparams, ''), why) of the search's start from random weights beside
    `model` (RANDOM_START_NETWORK; a key --hparams names stays the user's). Its anchors are the
    doctor's, checked with `model`'s: without an anchor_scale among `anchors` it keeps
    `model`'s own."""
    keys = [(key, value) for key, value in RANDOM_START_NETWORK if request.hparam(key) is None]
    why = ('%s with configs/demo.yaml\'s narrower BiFPN and heads (%s): from random weights it '
           'learns faster than %s at the same speed (docs/finetune.md)' % (
               RANDOM_START_MODEL, ', '.join('%s=%s' % item for item in keys) or
               'as --hparams sets them', model))
    if not any(key == 'anchor_scale' for key, _ in anchors) and request.hparam(
            'anchor_scale') is None:
        keys.append(('anchor_scale', hparams_config.get_efficientdet_config(model).anchor_scale))
        why += '; anchor_scale %s, %s\'s, whose anchors the data doctor checked' % (
            keys[-1][1], model)
    return RANDOM_START_MODEL, (tuple(keys), ''), why
