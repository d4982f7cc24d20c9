"""One configuration system: defaults for the whole system plus the D0-D7x scaling table.

A config is built as `defaults <- variant scaling fields <- YAML file <- "a=1,b.c=2" string`.
Keys are flat, as in the google/automl port, so users' existing `--hparams` strings keep
working; the NMS settings form the one nested group (`nms_configs.iou_thresh=0.6`).

Every override is type-checked against the default it replaces; unknown keys and unknown model
names are errors that list the valid choices. `to_yaml()` / `from_yaml()` round-trip exactly.
Key names and values of google/automl and Habana recipes are translated with a note
(config/automl_config.py).
"""
import copy
import difflib
import re

import yaml

from efficientdet_hpu.config import automl_config
from efficientdet_hpu.config.model_variants import MODEL_VARIANTS
from efficientdet_hpu.core.errors import UserError

IMAGENET_MEAN_RGB = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STDDEV_RGB = [0.229 * 255, 0.224 * 255, 0.225 * 255]

_DEFAULTS = {
    # Model.
    'name': 'efficientdet-d0',
    'backbone_name': 'efficientnet-b0',
    'image_size': 512,  # int for square, or 'WIDTHxHEIGHT' (e.g. '640x384').
    'num_classes': 90,
    'act_type': 'swish',
    'survival_prob': None,  # automl's: heads' drop-connect with residuals (None: neither).
    'backbone_survival_prob': None,  # Stochastic depth; None: automl's (B0 none, B1-B7 0.8).
    'batch_norm_momentum': 0.99,
    'batch_norm_epsilon': 1e-3,
    'sync_batch_norm': True,  # Average batch-norm moments across ranks (when more than one).
    'fpn_num_filters': 64,
    'fpn_cell_repeats': 3,
    'fpn_weight_method': 'fastattn',  # 'fastattn' | 'attn' | 'sum'.
    'separable_conv': True,
    'apply_bn_for_resampling': True,
    'conv_after_downsample': False,
    'conv_bn_act_pattern': False,
    'box_class_repeats': 3,
    # Anchors.
    'min_level': 3,
    'max_level': 7,
    'num_scales': 3,
    'aspect_ratios': [1.0, 2.0, 0.5],  # Width / height of each anchor.
    'anchor_scale': 4.0,
    'match_threshold': 0.5,
    'unmatched_threshold': 0.5,
    # Input.
    'input_rand_hflip': True,
    'jitter_min': 0.1,
    'jitter_max': 2.0,
    'max_instances_per_image': 100,
    'skip_crowd_during_training': True,
    # Crowd boxes the labeler sees (eval; training without skip_crowd_during_training):
    # 'positive' matches them as ordinary boxes (automl), 'ignore' ignores their anchors.
    'crowd_anchors': 'positive',
    # Box coordinates clipped to image_size - 1 (automl's input pipeline) or, false, to the
    # resized image's edge.
    'clip_boxes_to_last_pixel': True,
    'mean_rgb': IMAGENET_MEAN_RGB,
    'stddev_rgb': IMAGENET_STDDEV_RGB,
    'shuffle_buffer': 1024,
    # Losses.
    'alpha': 0.25,
    'gamma': 1.5,
    'delta': 0.1,
    'box_loss_weight': 50.0,
    'label_smoothing': 0.0,
    # Loss normaliser, automl's key: 0 the positives of this rank's batch + 1; > 0 a moving
    # average of that (this momentum); < 0 that count averaged over the ranks.
    'positives_momentum': 0.0,
    'iou_loss_type': 'none',  # 'none' | 'iou' | 'giou' | 'diou' | 'ciou'.
    'iou_loss_weight': 1.0,
    # Optimizer and schedule.
    'optimizer': 'sgd',  # 'sgd' (momentum) | 'adam'.
    'momentum': 0.9,
    'learning_rate': 0.08,  # For lr_base_batch_size images; scaled with the global batch.
    'lr_base_batch_size': 64,
    'lr_warmup_init': 0.008,
    'lr_warmup_epoch': 1.0,
    'lr_decay_method': 'cosine',  # 'cosine' | 'stepwise' | 'constant'.
    # cosine: automl's formula counts from step 0 and, past total - warm-up steps, rises again
    # (negligible for its 1-in-300-epoch warm-up); true runs it from the warm-up's end to 0.
    'cosine_from_warmup_end': False,
    'first_lr_drop_epoch': 200.0,
    'second_lr_drop_epoch': 250.0,
    'clip_gradients_norm': 10.0,
    # A regex: trainable variables whose name re.match-es it are not trained (automl's key;
    # training/var_freeze.py). '' or null: all are trained.
    'var_freeze_expr': '',
    # This project's: > 0 freezes var_freeze_expr's variables for the first N steps only, then
    # trains them at var_freeze_lr_multiplier x the learning rate (0: automl's whole-run freeze).
    'var_freeze_steps': 0,
    'var_freeze_lr_multiplier': 1.0,
    # Micro-batches of train_batch_size per rank summed into one optimizer step (the global
    # batch is ranks x train_batch_size x this); main.py's --global_batch_size derives it.
    'gradient_accumulation_steps': 1,
    'clip_gradients_per_variable': True,  # automl: each gradient to the norm, then globally.
    'weight_decay': 4e-5,
    'moving_average_decay': 0.9998,
    'num_epochs': 300,
    'mixed_precision': False,
    # Evaluation, export and prediction: automl's COCO-eval path (each anchor's best class,
    # soft-NMS per class) with boxes clipped to the image; docs/automl.md#post-processing.
    'nms_configs': {
        'method': 'gaussian',  # 'hard' | 'gaussian' (soft-NMS).
        'iou_thresh': 0.5,  # Hard NMS only.
        'score_thresh': 0.001,
        'sigma': 0.5,
        'max_nms_inputs': 0,  # K: the K best (anchor, class) pairs; 0: each anchor's best.
        'max_output_size': 100,
        'class_agnostic': False,  # True: automl's serving path (one NMS over all classes).
        'clip_to_image': True,  # Clipped to the photo, empty boxes dropped (automl: neither).
    },
}

_CHOICES = {
    'act_type': ('swish', 'relu', 'relu6'),
    'fpn_weight_method': ('fastattn', 'attn', 'sum'),
    'iou_loss_type': ('none', 'iou', 'giou', 'diou', 'ciou'),
    'optimizer': ('sgd', 'adam'),
    'crowd_anchors': ('positive', 'ignore'),
    'lr_decay_method': ('cosine', 'stepwise', 'constant'),
    'nms_configs.method': ('hard', 'gaussian'),
    'backbone_name': (tuple('efficientnet-b%d' % i for i in range(8))
                      + tuple('efficientnet-lite%d' % i for i in range(5))),
}

_IMAGE_SIZE_RE = re.compile(r'^\s*(\d+)\s*[xX]\s*(\d+)\s*$')
_OPTIONAL_FLOATS = ('survival_prob', 'backbone_survival_prob')  # null or a number in [0, 1].


class ConfigError(UserError, ValueError):
    """A user-facing configuration mistake; the message names the key and the fix."""


def _closest(name, choices):
    close = difflib.get_close_matches(name, choices, n=3)
    return (' Did you mean: %s?' % ', '.join(close)) if close else ''


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_value(key, default, value):
    """Returns `value` coerced to the type of `default`, or raises ConfigError."""
    if key.endswith('image_size'):
        return _check_image_size(value)
    if key == 'aspect_ratios[]':
        return _check_aspect_ratio(value)
    if key == 'var_freeze_expr' and value is None:
        return ''  # automl writes null for "freeze nothing".
    if key in _OPTIONAL_FLOATS:
        if value is None or _is_number(value) and 0 <= value <= 1:
            return value if value is None else float(value)
        raise ConfigError('%s must be null or 0 (off) or a keep probability in (0, 1], got %r'
                          % (key, value))
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError('%s must be true or false, got %r' % (key, value))
    if isinstance(default, float):
        if isinstance(value, str) and re.fullmatch(r'\s*[-+]?[\d.]+[eE][-+]?\d+\s*', value):
            value = float(value)  # YAML 1.1 reads '1e-3' (no dot) as a string.
        if _is_number(value):
            return float(value)
        raise ConfigError('%s must be a number, got %r' % (key, value))
    if isinstance(default, int):
        if _is_number(value) and float(value).is_integer():
            return int(value)
        raise ConfigError('%s must be an integer, got %r' % (key, value))
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError('%s must be a string, got %r' % (key, value))
        choices = _CHOICES.get(key)
        if choices and value not in choices:
            raise ConfigError('%s=%r is not one of: %s' % (key, value, ', '.join(choices)))
        return value
    if isinstance(default, list):
        if isinstance(value, str):  # automl's "1.0*2.0*0.5" list syntax.
            value = [yaml.safe_load(v) for v in value.split('*')]
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError('%s must be a non-empty list, got %r' % (key, value))
        return [_check_value(key + '[]', default[0], v) for v in value]
    raise ConfigError('%s cannot be overridden' % key)


def _check_aspect_ratio(value):
    """One anchor aspect ratio: a number (width / height, e.g. 2.0) or, as google/automl also
    accepts, an [x, y] pair of width and height multipliers (e.g. [1.4, 0.7]), kept as a list
    so the config stays YAML."""
    if _is_number(value) and value > 0:
        return float(value)
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(_is_number(v) and v > 0 for v in value)):
        return [float(v) for v in value]
    raise ConfigError('aspect_ratios entries must be positive numbers (width / height, e.g. '
                      '[1.0, 2.0, 0.5, 0.25]) or [x, y] pairs (e.g. [[1.4, 0.7], [0.7, 1.4]]), '
                      'got %r' % (value,))


def _check_image_size(value):
    if isinstance(value, str) and value.strip().isdigit():  # A tool's --image_size=512.
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and _IMAGE_SIZE_RE.match(value):
        width, height = _IMAGE_SIZE_RE.match(value).groups()
        return '%dx%d' % (int(width), int(height))
    raise ConfigError("image_size must be a positive integer or 'WIDTHxHEIGHT' "
                      "(e.g. 640x384), got %r" % (value,))


def parse_image_size(image_size):
    """Returns (height, width) from an int or a 'WIDTHxHEIGHT' string."""
    if isinstance(image_size, int):
        return image_size, image_size
    width, height = _IMAGE_SIZE_RE.match(image_size).groups()
    return int(height), int(width)


def override_texts(text):
    """'a=1,b.c=[1, 2]' -> {'a': '1', 'b.c': '[1, 2]'}: each key's value as typed (commas
    inside brackets do not split), for parse_override_string and for messages."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {'[': 1, ']': -1}.get(char, 0)
        if char == ',' and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items = [item.strip() for item in items + [text[start:]] if item.strip()]
    malformed = [item for item in items if '=' not in item]
    if malformed:
        raise ConfigError("hparams entry %r is not of the form key=value "
                          "(e.g. --hparams=num_classes=3,image_size=640x384)" % malformed[0])
    return {key.strip(): raw for key, raw in (item.split('=', 1) for item in items)}


def _yaml_value(raw):
    try:
        return yaml.safe_load(raw) if raw.strip() else ''
    except yaml.YAMLError:
        return raw


def parse_override_string(text):
    """Parses 'a=1,b.c=2,l=[1,2]' into {'a': 1, 'b.c': 2, 'l': [1, 2]}: YAML scalars or flow
    lists, split by override_texts."""
    return {key: _yaml_value(raw) for key, raw in override_texts(text).items()}


def flatten_keys(mapping, prefix=''):
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, prefix + key + '.'))
        else:
            flat[prefix + key] = value
    return flat


class Config:
    """Attribute-access configuration; nested groups are Configs too; frozen: read-only."""

    def __init__(self, values=None, frozen=False):
        object.__setattr__(self, '_values', {})
        object.__setattr__(self, '_frozen', frozen)
        for key, value in (values or {}).items():
            self._values[key] = Config(value, frozen) if isinstance(value, dict) else value

    def __getattr__(self, key):
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError('config has no key %r.%s' % (key, _closest(key, list(self._values))))

    def __setattr__(self, key, value):
        self.override({key: value})

    def __getitem__(self, key):
        return getattr(self, key)

    def __contains__(self, key):
        return key in self._values

    def __eq__(self, other):
        return isinstance(other, Config) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return 'Config(%r)' % self.as_dict()

    def __deepcopy__(self, memo):
        return self if self._frozen else Config(self.as_dict())

    is_frozen = property(lambda self: self._frozen)

    def frozen(self):  # A copy that raises on any change; itself when already frozen.
        return self if self._frozen else Config(self.as_dict(), frozen=True)

    def keys(self):
        return list(self._values)

    def get(self, key, default=None):
        return self._values.get(key, default)

    def as_dict(self):
        return {k: v.as_dict() if isinstance(v, Config) else copy.deepcopy(v)
                for k, v in self._values.items()}

    def override(self, overrides):
        """Applies a dict (nested or dotted keys), an 'a=1,b.c=2' string or a YAML path."""
        if self._frozen:
            raise TypeError('this config is finalised (config/settings.py): change a copy, '
                            'Config(config.as_dict())')
        if isinstance(overrides, str):
            overrides = (load_yaml(overrides) if is_yaml_path(overrides)
                         else parse_override_string(overrides))
        flat = automl_config.translate_aliases(flatten_keys(dict(overrides)))
        for key, value in flat.items():
            self._set_dotted(key, value)
        return self

    def _set_dotted(self, dotted_key, value):
        node, parts = self, dotted_key.split('.')
        for depth, part in enumerate(parts):
            valid = node.keys()
            if part not in valid:
                where = '.'.join(parts[:depth]) or 'the config'
                raise ConfigError('unknown hparams key %r.%s Valid keys of %s: %s' % (
                    dotted_key, _closest(part, valid), where, ', '.join(sorted(valid))))
            if depth < len(parts) - 1:
                node = node._values[part]
                if not isinstance(node, Config):
                    raise ConfigError('%r is not a group; %r cannot be set' % (part, dotted_key))
        current = node._values[parts[-1]]
        if isinstance(current, Config):
            if not isinstance(value, dict):
                raise ConfigError('%s is a group; set its fields, e.g. %s.%s=...' % (
                    dotted_key, dotted_key, current.keys()[0]))
            current.override(value)
            return
        node._values[parts[-1]] = _check_value(dotted_key, current, value)

    def to_yaml(self):
        return yaml.safe_dump(self.as_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text):
        return cls(yaml.safe_load(text))


def is_yaml_path(text):
    return isinstance(text, str) and text.strip().lower().endswith(('.yaml', '.yml'))


def load_yaml(path):
    """Reads a YAML mapping with the safe loader (a config file can never run code)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError('cannot read hparams file %s: %s' % (path, e.strerror))
    except yaml.YAMLError as e:
        raise ConfigError('hparams file %s is not valid YAML: %s' % (path, e))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError('hparams file %s must hold a mapping of key: value, got %s' % (
            path, type(data).__name__))
    return data


def anchor_settings(config):
    """anchors.generate_anchor_boxes' keyword arguments from a Config (a run's
    settings.config)."""
    return {key: config[key] for key in
            ('min_level', 'max_level', 'num_scales', 'aspect_ratios', 'anchor_scale')}


def anchors_per_location(config):
    return config['num_scales'] * len(config['aspect_ratios'])


def nms_settings(config):
    """postprocess.generate_detections' NMS keyword arguments from a Config."""
    nms = config['nms_configs']
    return {key: nms[key] for key in ('method', 'iou_thresh', 'score_thresh', 'sigma',
                                      'max_nms_inputs', 'max_output_size', 'class_agnostic',
                                      'clip_to_image')}


def get_efficientdet_config(model_name='efficientdet-d0'):
    """Returns the default config of one variant, e.g. 'efficientdet-d3'."""
    if model_name not in MODEL_VARIANTS:
        raise ConfigError('unknown model_name %r.%s Valid: %s' % (
            model_name, _closest(model_name, list(MODEL_VARIANTS)), ', '.join(MODEL_VARIANTS)))
    config = Config(copy.deepcopy(_DEFAULTS))
    config.override(dict(MODEL_VARIANTS[model_name], name=model_name))
    return config


def validate(config):
    """Cross-field checks that single-key type checks cannot make."""
    height, width = parse_image_size(config.image_size)
    # Levels above 5 round up, as automl (ops/anchors.py exact_stride, without TensorFlow here).
    stride = 2 ** min(config.max_level, 5)
    if height % stride or width % stride:
        raise ConfigError('image_size %s must be divisible by 2^min(max_level, 5) = %d in both '
                          'dimensions; try %dx%d' % (config.image_size, stride,
                                                     -(-width // stride) * stride,
                                                     -(-height // stride) * stride))
    if not 1 <= config.min_level < config.max_level or config.min_level > 5:
        raise ConfigError('need 1 <= min_level <= 5 and min_level < max_level (the BiFPN fuses '
                          'at least two levels), got %d..%d' % (config.min_level, config.max_level))
    if config.num_classes < 1:
        raise ConfigError('num_classes must be >= 1, got %d' % config.num_classes)
    if config.gradient_accumulation_steps < 1:
        raise ConfigError('gradient_accumulation_steps must be >= 1 (1: no accumulation), got %d'
                          % config.gradient_accumulation_steps)
    if not 0 <= config.jitter_min <= config.jitter_max:
        raise ConfigError('need 0 <= jitter_min <= jitter_max, got %s..%s'
                          % (config.jitter_min, config.jitter_max))
    return config
