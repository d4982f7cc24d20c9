"""Label map: training labels <-> the source dataset's category ids, in one of two layouts.

Format of `<prefix>-label_map.json`, written beside the TFRecord shards (docs/CONTRACTS.md):

    {"num_classes": 3, "classes": [{"label": 1, "category_id": 11, "name": "circle"}, ...]}
    {"num_classes": 90, "layout": "category_id", "classes": [{"label": 1, "category_id": 1,
     "name": "person"}, ...]}

- "contiguous" (the default; no "layout" key): labels 1..N assigned to the categories sorted
  by category id, so a dataset's label map does not depend on the order of its JSON. Any
  category ids work.
- "category_id": google/automl's COCO layout, label = category id and num_classes = 90, so
  COCO's 80 categories keep their ids 1..90 and automl's 90-way class head (its released
  checkpoints) fits. Only for ids 1..90; labels of missing ids are never used.

The network's class index is `label - 1`; `category_id` is what results files and metrics
report.
"""
import dataclasses
import json
import os
import re
from typing import Dict, Iterable, Mapping, Optional

import tensorflow as tf

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.errors import UserError

LABEL_MAP_SUFFIX = '-label_map.json'
# '-00003-of-00032.tfrecord', '-*-of-00032.tfrecord', '-?????-of-?????' ...
_SHARD_SUFFIX = re.compile(r'-[^-/]+-of-[^-/]+$')
_GLOB_CHARS = re.compile(r'[*?\[]')


LAYOUTS = ('contiguous', 'category_id')
CATEGORY_ID_NUM_CLASSES = 90  # automl's COCO class head: category ids 1..90.

# The label map of the data a run trained on, copied into its model_dir by main.py so that
# export, predict and eval name classes with no extra flag.
MODEL_DIR_FILE = 'label_map.json'


class LabelMapError(UserError, ValueError):
    """A label map file is malformed; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Mapping between labels (1..num_classes) and source category ids/names. In the
    category_id layout only the labels of existing categories are listed."""
    num_classes: int
    label_to_category_id: Dict[int, int]
    label_to_name: Dict[int, str]
    category_id_to_label: Dict[int, int]
    layout: str = 'contiguous'

    @classmethod
    def from_categories(cls, categories: Iterable[Mapping],
                        layout: str = 'contiguous') -> 'LabelMap':
        """`categories`: COCO dicts with id, name. contiguous: labels 1..N in ascending
        category-id order; category_id: label = category id (ids 1..90, else LabelMapError)."""
        ordered = sorted(categories, key=lambda category: category['id'])
        ids = [int(category['id']) for category in ordered]
        if len(set(ids)) != len(ids):
            raise ValueError(f'duplicate category ids in {ids}')
        if layout == 'category_id':
            outside = [cid for cid in ids if not 1 <= cid <= CATEGORY_ID_NUM_CLASSES]
            if outside:
                raise LabelMapError(
                    f'the category_id label layout (automl\'s COCO layout) needs category ids '
                    f'1..{CATEGORY_ID_NUM_CLASSES}; ids {outside[:10]} are outside it. Use the '
                    f'contiguous layout for these data.')
            labels, num_classes = ids, CATEGORY_ID_NUM_CLASSES
        elif layout == 'contiguous':
            labels, num_classes = list(range(1, len(ids) + 1)), len(ids)
        else:
            raise LabelMapError(f'label layout {layout!r} is not one of {", ".join(LAYOUTS)}')
        return cls(num_classes=num_classes,
                   label_to_category_id=dict(zip(labels, ids)),
                   label_to_name={label: str(category['name'])
                                  for label, category in zip(labels, ordered)},
                   category_id_to_label=dict(zip(ids, labels)), layout=layout)

    def to_json_dict(self) -> dict:
        classes = [{'label': label, 'category_id': self.label_to_category_id[label],
                    'name': self.label_to_name[label]}
                   for label in sorted(self.label_to_category_id)]
        layout = {} if self.layout == 'contiguous' else {'layout': self.layout}
        return dict({'num_classes': self.num_classes}, **layout, classes=classes)


def write_label_map(path: str, categories: Iterable[Mapping],
                    layout: str = 'contiguous') -> LabelMap:
    """Writes the label map for COCO `categories` (dicts with id, name) atomically to `path`."""
    label_map = LabelMap.from_categories(categories, layout)
    atomic_file.write_json_atomically(path, label_map.to_json_dict(), indent=2)
    return label_map


def _parse_classes(path: str, content) -> LabelMap:
    if not isinstance(content, dict) or not isinstance(content.get('classes'), list):
        raise LabelMapError(f'label map {path}: expected an object with a "classes" list.')
    label_to_category_id, label_to_name = {}, {}
    for index, entry in enumerate(content['classes']):
        if (not isinstance(entry, dict) or not _is_int(entry.get('label'))
                or not _is_int(entry.get('category_id')) or not isinstance(entry.get('name'), str)):
            raise LabelMapError(f'label map {path}: classes[{index}] = {entry!r} needs an integer '
                                f'"label", an integer "category_id" and a string "name".')
        if entry['label'] in label_to_category_id:
            raise LabelMapError(f'label map {path}: label {entry["label"]} appears twice.')
        label_to_category_id[entry['label']] = entry['category_id']
        label_to_name[entry['label']] = entry['name']
    layout = content.get('layout', 'contiguous')
    check = _check_category_id_layout if layout == 'category_id' else _check_contiguous
    num_classes = check(path, content, label_to_category_id)
    category_id_to_label = {cid: label for label, cid in label_to_category_id.items()}
    if len(category_id_to_label) != len(label_to_category_id):
        raise LabelMapError(f'label map {path}: a category_id is used by two labels.')
    return LabelMap(num_classes, label_to_category_id, label_to_name, category_id_to_label,
                    layout)


def _check_contiguous(path, content, label_to_category_id) -> int:
    if content.get('layout', 'contiguous') != 'contiguous':
        raise LabelMapError(f'label map {path}: "layout" is {content.get("layout")!r}, not one '
                            f'of {", ".join(LAYOUTS)}.')
    num_classes = len(label_to_category_id)
    if sorted(label_to_category_id) != list(range(1, num_classes + 1)):
        raise LabelMapError(f'label map {path}: labels must be exactly 1..{num_classes}, got '
                            f'{sorted(label_to_category_id)}.')
    if content.get('num_classes') != num_classes:
        raise LabelMapError(f'label map {path}: "num_classes" is {content.get("num_classes")!r} '
                            f'but {num_classes} classes are listed.')
    return num_classes


def _check_category_id_layout(path, content, label_to_category_id) -> int:
    num_classes = content.get('num_classes')
    if not _is_int(num_classes) or num_classes < max(label_to_category_id, default=1):
        raise LabelMapError(f'label map {path}: "num_classes" is {num_classes!r}, below its '
                            f'largest label {max(label_to_category_id, default=1)}.')
    differing = [label for label, cid in label_to_category_id.items() if label != cid]
    if differing or min(label_to_category_id, default=1) < 1:
        raise LabelMapError(f'label map {path}: in the category_id layout every label is its '
                            f'category id (and >= 1); labels {differing[:10]} are not.')
    return num_classes


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_label_map(path: str) -> LabelMap:
    """Reads and validates a label map; raises LabelMapError naming `path` when malformed."""
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f'label map {path} does not exist; it is written by '
                                f'dataset/create_coco_tfrecord.py beside the shards.')
    with tf.io.gfile.GFile(path, 'r') as handle:
        text = handle.read()
    try:
        content = json.loads(text)
    except json.JSONDecodeError as error:
        raise LabelMapError(f'label map {path} is not valid JSON: {error.msg} at line '
                            f'{error.lineno} column {error.colno}.') from None
    return _parse_classes(path, content)


def _prefix_candidates(file_pattern: str):
    """Yields dataset prefixes ('/data/train') that `file_pattern` may belong to."""
    directory, name = os.path.split(file_pattern)
    stem = _SHARD_SUFFIX.sub('', name)
    stem = _GLOB_CHARS.split(stem, maxsplit=1)[0]
    stem = re.sub(r'\.tfrecord$', '', stem).rstrip('-_.')
    if stem:
        yield os.path.join(directory, stem)
    if _GLOB_CHARS.search(file_pattern):
        # A pattern like '/data/*.tfrecord' names no prefix: look at a file it matches.
        matches = sorted(tf.io.gfile.glob(file_pattern))
        if matches:
            directory, name = os.path.split(matches[0])
            yield os.path.join(directory, re.sub(r'\.tfrecord$', '', _SHARD_SUFFIX.sub('', name)))


def label_map_path_for(file_pattern_or_prefix: str) -> Optional[str]:
    """Finds `<prefix>-label_map.json` for a shard pattern or prefix; None when absent.

    Accepts '/data/train-*-of-00032.tfrecord', '/data/train-00000-of-00032.tfrecord',
    '/data/train*' or the prefix '/data/train'; of a comma-separated list the first entry.
    """
    first_pattern = file_pattern_or_prefix.split(',')[0].strip()
    if not first_pattern:
        return None
    for prefix in _prefix_candidates(first_pattern):
        candidate = prefix + LABEL_MAP_SUFFIX
        if tf.io.gfile.exists(candidate):
            return candidate
    return None
