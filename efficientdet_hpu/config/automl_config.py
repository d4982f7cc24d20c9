"""google/automl's hparams as this project reads them: the `config.yaml` automl writes into
its model_dir, and the automl / Habana key names a recipe may use.

Plain dict-to-dict functions (no Config object, so hparams_config.py can call them):

  load_yaml_text(text)      automl's YAML, read safely: `!!python/tuple` (automl writes
                            image_size as one) becomes a list, any other Python tag is refused
                            and nothing in the file runs.
  is_automl_config(values)  True for automl's config.yaml (it has keys only automl writes).
  project_values(values)    automl's keys -> (model name, this project's keys and values).
  translate_aliases(flat)   reference key names and values in a recipe or --hparams
                            (use_bfloat16, nms_configs.method: null, ...) -> this project's.

Every rename or dropped key is logged once as a one-line note.
"""
import yaml
from absl import logging

from efficientdet_hpu.core.errors import UserError

_TUPLE_TAG = 'tag:yaml.org,2002:python/tuple'
# Keys only automl writes (none of them is a key of this project's config).
_AUTOML_MARKERS = frozenset(('is_training_bn', 'use_keras_model', 'strategy', 'data_format',
                             'ckpt_var_scope', 'skip_mismatch', 'fpn_name', 'heads'))
# automl keys with the same name and meaning here.
_SAME = (
    'backbone_name', 'num_classes', 'act_type', 'survival_prob', 'fpn_num_filters',
    'fpn_cell_repeats', 'separable_conv', 'apply_bn_for_resampling', 'conv_after_downsample',
    'conv_bn_act_pattern', 'box_class_repeats', 'min_level', 'max_level', 'num_scales',
    'aspect_ratios', 'anchor_scale', 'input_rand_hflip', 'jitter_min', 'jitter_max',
    'max_instances_per_image', 'skip_crowd_during_training', 'mean_rgb', 'stddev_rgb', 'alpha',
    'gamma', 'delta', 'box_loss_weight', 'label_smoothing', 'iou_loss_weight', 'momentum',
    'learning_rate', 'lr_warmup_init', 'lr_warmup_epoch', 'first_lr_drop_epoch',
    'second_lr_drop_epoch', 'clip_gradients_norm', 'weight_decay', 'moving_average_decay',
    'num_epochs', 'mixed_precision', 'var_freeze_expr')
# Training-only automl keys whose values this project does not offer: dropped with a note.
_TRAINING_CHOICES = {'optimizer': ('sgd', 'adam'),
                     'lr_decay_method': ('cosine', 'stepwise', 'constant')}
# automl keys that change nothing this project computes, or that it has no counterpart for.
_INERT = frozenset((
    'name', 'image_size', 'iou_loss_type', 'fpn_weight_method', 'nms_configs', 'optimizer',
    'lr_decay_method', 'target_size', 'grid_mask', 'sample_image', 'map_freq',
    'seg_num_classes', 'label_map', 'regenerate_source_id', 'is_training_bn', 'poly_lr_power',
    'data_format', 'scale_range', 'strategy', 'loss_scale', 'drop_remainder',
    'tflite_max_detections', 'img_summary_steps', 'ckpt_var_scope', 'skip_mismatch',
    'use_keras_model', 'dataset_type',
    'grad_checkpoint', 'verbose', 'save_freq', 'autoaugment_policy', 'heads', 'fpn_name',
    'fpn_config', 'backbone_config'))
NMS_METHOD_ALIASES = {None: 'hard', '': 'hard'}  # automl's nms(): "method == 'hard' or not method"
NUMPY_ONLY_METHODS = ('linear', 'diou')  # automl runs these only in its NumPy (pyfunc) NMS.
_noted = set()


class AutomlConfigError(UserError, ValueError):
    """An automl config this project cannot reproduce; the message names the key."""


def note(text):
    """Logs `text` once per process (configs are resolved more than once in a run)."""
    if text not in _noted:
        _noted.add(text)
        logging.info('note: %s', text)


class _Loader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """The safe loader plus automl's `!!python/tuple`, built as a plain list."""


_Loader.add_constructor(_TUPLE_TAG, lambda loader, node: loader.construct_sequence(node))


def load_yaml_text(text, source='config.yaml'):
    """A YAML mapping; automl's tuples as lists. Raises AutomlConfigError naming `source`."""
    try:
        data = yaml.load(text, Loader=_Loader)  # nosec: a SafeLoader, plus lists for tuples.
    except yaml.YAMLError as error:
        raise AutomlConfigError('%s is not a config this project can read safely (no Python '
                                'object in it is built or run): %s' % (source, error))
    if data is not None and not isinstance(data, dict):
        raise AutomlConfigError('%s must hold a mapping of key: value, got %s'
                                % (source, type(data).__name__))
    return data or {}


def is_automl_config(values):
    return bool(_AUTOML_MARKERS & set(values))


def _image_size(value):
    """automl: an int, 'WxH', or (height, width) -> this project's int or 'WIDTHxHEIGHT'."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        height, width = (int(v) for v in value)
        return height if height == width else '%dx%d' % (width, height)
    return value


def _check_architecture(values):
    """automl options that build another network than this project's: errors."""
    problems = []
    if values.get('backbone_config') is not None:
        problems.append('backbone_config (custom EfficientNet blocks)')
    if values.get('fpn_config') is not None or values.get('fpn_name') not in (None, 'bifpn'):
        problems.append('fpn_name=%r / fpn_config (only the BiFPN is built here)'
                        % values.get('fpn_name'))
    if problems:
        raise AutomlConfigError('automl config: %s cannot be reproduced here'
                                % '; '.join(problems))
    heads = values.get('heads') or ['object_detection']
    if list(heads) != ['object_detection']:
        note('automl heads=%s: only the detection heads are built here' % list(heads))


def _check_method(method):
    if isinstance(method, str) and method in NUMPY_ONLY_METHODS:
        raise AutomlConfigError(
            "nms_configs.method=%r: automl has it only in its NumPy NMS (pyfunc); here NMS runs "
            "in the graph with 'hard' or 'gaussian' (soft-NMS)" % method)


def _nms_values(nms):
    """automl's nms_configs with the fallbacks automl's nms() applies to null / 0 values, for
    its COCO-eval path: per class, boxes not clipped."""
    method = NMS_METHOD_ALIASES.get(nms.get('method'), nms.get('method'))
    _check_method(method)
    values = {'method': method, 'iou_thresh': nms.get('iou_thresh') or 0.5,
              'sigma': nms.get('sigma') or 0.5,
              'score_thresh': nms.get('score_thresh') or (0.001 if method == 'gaussian' else 0.0),
              'class_agnostic': False, 'clip_to_image': False}
    for key in ('max_nms_inputs', 'max_output_size'):
        if nms.get(key) is not None:
            values[key] = nms[key]
    if nms.get('pyfunc'):
        note("automl nms_configs.pyfunc=true (its NumPy NMS) is run as the in-graph NMS here")
    return values


def project_values(values):
    """automl's config.yaml values -> (model name, {this project's key: value})."""
    _check_architecture(values)
    result = {key: values[key] for key in _SAME if key in values}
    if 'image_size' in values:
        result['image_size'] = _image_size(values['image_size'])
    result['iou_loss_type'] = values.get('iou_loss_type') or 'none'
    # automl's bifpn_config: `weight_method or 'fastattn'` (D6-D7x write 'sum').
    result['fpn_weight_method'] = values.get('fpn_weight_method') or 'fastattn'
    for key, choices in _TRAINING_CHOICES.items():
        if key in values and values[key] not in choices:
            note('automl %s=%r is not offered here (training only): %s is kept at its default'
                 % (key, values[key], key))
        elif key in values:
            result[key] = values[key]
    result['nms_configs'] = _nms_values(values.get('nms_configs') or {})
    # automl: `params.get('positives_momentum', None) or 0`.
    result['positives_momentum'] = values.get('positives_momentum') or 0.0
    ignored = sorted(set(values) - set(_SAME) - _INERT)
    if ignored:
        note('automl config keys not used here: %s' % ', '.join(ignored))
    return values.get('name', 'efficientdet-d0'), result


def translate_aliases(flat):
    """{dotted key: value} of a recipe or override string, with the reference ports' names and
    values in this project's terms; each translation is noted once."""
    flat = dict(flat)
    if 'use_bfloat16' in flat:
        value = flat.pop('use_bfloat16')
        note('use_bfloat16=%s (Habana) read as mixed_precision=%s' % (value, value))
        flat.setdefault('mixed_precision', value)
    method = flat.get('nms_configs.method', 'hard')
    _check_method(method)
    if isinstance(method, (str, type(None))) and method in NMS_METHOD_ALIASES:
        note('nms_configs.method=%r (automl: hard NMS) read as hard' % flat['nms_configs.method'])
        flat['nms_configs.method'] = 'hard'
    for key in ('nms_configs.iou_thresh', 'nms_configs.sigma'):
        if key in flat and flat[key] is None:
            note('%s=null read as automl\'s default 0.5' % key)
            flat[key] = 0.5
    if 'positives_momentum' in flat and flat['positives_momentum'] is None:
        flat['positives_momentum'] = 0.0  # automl's `or 0`: the batch's own count.
    if 'nms_configs.pyfunc' in flat:
        note('nms_configs.pyfunc (automl\'s NumPy NMS) ignored: NMS runs in the graph here')
        del flat['nms_configs.pyfunc']
    if flat.get('survival_prob') is not None:
        note('survival_prob=%s is automl\'s: drop-connect with a residual in the class and box '
             'heads; the backbone\'s stochastic depth is backbone_survival_prob'
             % flat['survival_prob'])
    return flat
