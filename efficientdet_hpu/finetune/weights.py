"""What --weights names (nothing is ever downloaded):
  an ImageNet backbone   an EfficientNet-Lite .pth (efficientnet-lite0-*.pth: Lite0's), or an
                         EfficientNet checkpoint directory or prefix named efficientnet-*
                         -> main.py --backbone_ckpt
  a whole detector       a model_dir or checkpoint prefix (this project's or google/automl's)
                         -> main.py --ckpt; its model from the config.yaml beside it, else
                         from an efficientdet-* name in its path
"""
import os
import re

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import plan

_LITE_PTH = re.compile(r'efficientnet[-_]lite(\d)', re.IGNORECASE)
_DETECTOR_NAME = re.compile(r'efficientdet-(d\d+x?|lite\d+x?)')


class WeightsError(UserError):
    """--weights names nothing usable; the message says what is expected."""


def _exists(path):
    return (os.path.exists(path) or os.path.exists(path + '.index')
            or os.path.exists(path + '.data-00000-of-00001'))


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
    """The Weights of --weights=path; model_name: --model_name, checked against them."""
    if not path:
        return plan.Weights()
    path = os.path.abspath(os.path.expanduser(path))
    if not _exists(path):
        raise WeightsError('--weights=%s does not exist; give an EfficientNet-Lite .pth, an '
                           'EfficientNet checkpoint, or a detector model_dir or checkpoint '
                           'prefix' % path)
    name = os.path.basename(path.rstrip('/'))
    if name.lower().endswith('.pth'):
        found = _LITE_PTH.search(name)
        weights = plan.Weights('backbone', path,
                               'efficientdet-lite%s' % found.group(1) if found else '')
    elif name.startswith('efficientnet-') or os.path.basename(
            os.path.dirname(path)).startswith('efficientnet-'):
        weights = plan.Weights('backbone', path, '')
    else:
        weights = plan.Weights('detector', path, _detector_model(path))
    if model_name and weights.model_name and model_name != weights.model_name:
        raise WeightsError('--weights=%s are %s\'s but --model_name=%s; drop --model_name or '
                           'give weights of that model' % (path, weights.model_name, model_name))
    return weights
