"""What an inference graph is built from: a training run directory's config, label map and
checkpoint (model_dir/config.yaml and flags.json, as main.py writes them)."""
import dataclasses
import json
import os

from absl import logging

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core.errors import InferenceError  # Defined without TensorFlow.
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.checkpoints import checkpoint_integrity
from efficientdet_hpu.checkpoints import checkpoints


@dataclasses.dataclass
class ModelSpec:
    """What an inference graph is built from."""
    config: hparams_config.Config
    label_map: object  # dataset.label_map.LabelMap, or None: category id = label.
    checkpoint: str  # None: random weights (benchmarking only).
    label_map_path: str = None


def _read_config(model_dir, hparams):
    path = os.path.join(model_dir, 'config.yaml')
    if not os.path.isfile(path):
        raise InferenceError('%s does not exist; --model_dir must be a directory main.py '
                             'trained into (it writes config.yaml there)' % path)
    saved = recipe.read_saved_config(path)  # Ours, or automl's config.yaml as automl wrote it.
    return recipe.resolve(saved.name, hparams, base=saved)


def run_flags(model_dir):
    """model_dir/flags.json (the flags main.py ran with) as a dict; {} when there is none."""
    path = os.path.join(model_dir or '', 'flags.json')
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _find_label_map_path(model_dir):
    """model_dir's own copy of the label map (main.py writes it), else the one beside the
    TFRecords named in model_dir/flags.json."""
    copied = os.path.join(model_dir, label_map_lib.MODEL_DIR_FILE)
    if os.path.isfile(copied):
        return copied
    flags_used = run_flags(model_dir)
    for key in ('training_file_pattern', 'validation_file_pattern'):
        if flags_used.get(key):
            found = label_map_lib.label_map_path_for(flags_used[key])
            if found:
                return found
    return None


def _checkpoint_path(model_dir, checkpoint, argument):
    """--checkpoint, else model_dir's newest (as `checkpoint` lists it, even when its files
    are damaged or gone); raises when it is damaged (checkpoints/checkpoint_integrity.py),
    naming the intact one to pass as `argument`."""
    if checkpoint:
        path = checkpoints.resolve_checkpoint(checkpoint, 'checkpoint')
    else:
        listed = checkpoint_integrity.listed_checkpoints(model_dir)
        path = listed[0] if listed else checkpoints.latest_checkpoint(model_dir)
        if path is None:
            raise InferenceError('no checkpoint in --model_dir=%s; train first or pass '
                                 '--checkpoint' % model_dir)
    checkpoint_integrity.check_for_reading(path, argument)
    return path


def load_model_spec(model_dir, checkpoint=None, hparams='', label_map_path=None,
                    random_weights=False, checkpoint_argument='--checkpoint=%s'):
    """Config, label map and checkpoint of a training run directory; a damaged checkpoint's
    message names the intact one to pass as checkpoint_argument (a format of its path)."""
    config = _read_config(model_dir, hparams)
    label_map_path = label_map_path or _find_label_map_path(model_dir)
    label_map = label_map_lib.load_label_map(label_map_path) if label_map_path else None
    if label_map is None:
        logging.warning('no label map found for %s (pass --label_map): classes are reported '
                        'as labels 1..%d', model_dir, config.num_classes)
    elif label_map.num_classes > config.num_classes:
        raise InferenceError('label map %s has %d classes but the model has num_classes=%d'
                             % (label_map_path, label_map.num_classes, config.num_classes))
    return ModelSpec(config, label_map,
                     None if random_weights else _checkpoint_path(model_dir, checkpoint,
                                                                   checkpoint_argument),
                     label_map_path)
