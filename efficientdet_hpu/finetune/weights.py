"""What --weights names (nothing is ever downloaded), told from the file's bytes
(checkpoints/weight_files.py) before anything is written, so a file of another kind or model
(an Ultralytics .pt, a SavedModel) is one line naming it and what is accepted:
  an ImageNet backbone   an EfficientNet-Lite .pth (efficientnet-lite0-*.pth: Lite0's), or an
                         EfficientNet TF checkpoint (its variables under efficientnet-*/)
                         -> main.py --backbone_ckpt
  a whole detector       a model_dir or checkpoint prefix (this project's or google/automl's:
                         class_net/ and box_net/ variables) -> main.py --ckpt; its model from
                         the config.yaml beside it, else from an efficientdet-* name in its path
A TF checkpoint whose names cannot be read is taken by its name, as before: efficientnet-* is a
backbone, anything else a detector.
"""
import os
import re

from efficientdet_hpu.checkpoints import weight_files
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import plan

_LITE_PTH = re.compile(r'efficientnet[-_]lite(\d)', re.IGNORECASE)
_DETECTOR_NAME = re.compile(r'efficientdet-(d\d+x?|lite\d+x?)')


class WeightsError(UserError):
    """--weights names nothing usable; the message says what is expected."""


def _detector_model(path):
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config = os.path.join(directory, 'config.yaml')
    if os.path.isfile(config):
        try:
            return recipe.read_saved_config(config).name
        except hparams_config.ConfigError:
            pass
    found = _DETECTOR_NAME.search(os.path.abspath(path))
    return 'efficientdet-' + found.group(1) if found else ''


def resolve(path, model_name='') -> plan.Weights:
    """The Weights of --weights=path; model_name: --model_name, checked against them. Raises
    weight_files.WeightFileError, WeightsError."""
    if not path:
        return plan.Weights()
    path = os.path.abspath(os.path.expanduser(path))
    found = weight_files.check('weights', path)
    path = path if os.path.isdir(path) else found.path  # A checkpoint's .index: its prefix.
    role = found.role
    if role is None:  # A TF checkpoint whose .index names could not be read.
        named = os.path.basename(path.rstrip('/')), os.path.basename(os.path.dirname(path))
        role = (weight_files.BACKBONE if any(n.startswith('efficientnet-') for n in named)
                else weight_files.DETECTOR)
    if role == weight_files.BACKBONE:
        found_lite = _LITE_PTH.search(os.path.basename(path))
        weights = plan.Weights('backbone', path, 'efficientdet-lite%s' % found_lite.group(1)
                               if found_lite and found.kind == 'torch-legacy' else '')
    else:
        weights = plan.Weights('detector', path, _detector_model(path))
    if model_name and weights.model_name and model_name != weights.model_name:
        raise WeightsError('--weights=%s are %s\'s but --model_name=%s; drop --model_name or '
                           'give weights of that model' % (path, weights.model_name, model_name))
    return weights
