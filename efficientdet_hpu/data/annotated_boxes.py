"""The data doctor's input: every annotated box of a dataset as flat NumPy arrays.

Reads a COCO instances JSON or the converter's TFRecords and keeps only what the geometry
needs: boxes, classes, crowd flags and image sizes. Classes follow the converter's label map
(labels 1..N in ascending category id; class index = label - 1), so a class index here is the
class index the network is trained with. Boxes a converter would drop (malformed, zero-size,
outside the image) are dropped and counted; boxes crossing the image border are clipped, as
data/coco_annotations.py does.
"""
import dataclasses
import itertools
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from efficientdet_hpu.data import coco_annotations
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data import tfrecord_framing
from efficientdet_hpu.data.record_parser import CONVERTER_HINT


LabelMapError = label_map_lib.LabelMapError


class DoctorInputError(ValueError):
    """The annotations cannot be read; the message names the file, the entry and the fix."""


@dataclasses.dataclass
class BoxSet:
    """All boxes of a dataset.

    boxes: float64 [N, 4], [ymin, xmin, ymax, xmax] in original image pixels.
    class_index: int64 [N], 0..num_classes-1 (label - 1).
    is_crowd: bool [N].
    image_index: int64 [N], row of the box's image in image_sizes.
    image_sizes: int64 [M, 2], (height, width) of every image, boxes or not.
    class_names: num_classes names, by class index.
    source: what was read, for the report ('instances_train.json').
    skipped: {reason: count} of boxes left out ('malformed', 'degenerate', 'outside').
    """
    boxes: np.ndarray
    class_index: np.ndarray
    is_crowd: np.ndarray
    image_index: np.ndarray
    image_sizes: np.ndarray
    class_names: List[str]
    source: str
    skipped: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def subset(self, keep: np.ndarray) -> 'BoxSet':
        """The boxes where `keep` (bool [N] or indices); images and classes unchanged."""
        return dataclasses.replace(self, boxes=self.boxes[keep], is_crowd=self.is_crowd[keep],
                                   class_index=self.class_index[keep],
                                   image_index=self.image_index[keep])


def _bbox_row(bbox):
    """One COCO bbox as 4 floats; NaNs when it is not a list of 4 numbers."""
    try:
        row = [float(value) for value in bbox]
    except (TypeError, ValueError):
        return [np.nan] * 4
    return row if len(row) == 4 else [np.nan] * 4


def _coco_boxes(annotations):
    """COCO [x, y, w, h] of every annotation -> float64 [N, 4]; NaN rows where malformed."""
    try:
        xywh = np.asarray([annotation['bbox'] for annotation in annotations], dtype=np.float64)
        if xywh.shape == (len(annotations), 4):
            return xywh
    except (KeyError, TypeError, ValueError):
        pass
    # A missing, ragged or non-numeric bbox somewhere: check them one by one.
    rows = [_bbox_row(annotation.get('bbox')) for annotation in annotations]
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


def _lookup(annotations, key, index_of, json_path, known):
    """Index of every annotation's `key` (image_id or category_id) via the dict index_of."""
    try:
        return np.fromiter((index_of[a[key]] for a in annotations), np.int64, len(annotations))
    except (KeyError, TypeError):
        pass
    for position, annotation in enumerate(annotations):
        value = annotation.get(key) if isinstance(annotation, dict) else None
        try:
            index_of[value]
        except (KeyError, TypeError):
            raise DoctorInputError(
                f'{json_path}: annotations[{position}] = {str(annotation)[:200]} refers to '
                f'{key} {value!r}, which is not in "{known}"; fix or drop that annotation.'
            ) from None
    raise AssertionError('unreachable')


def clip_pixel_boxes(xywh, image_sizes):
    """COCO [x, y, w, h] float64 [N, 4] and (height, width) [N, 2] -> ([ymin, xmin, ymax,
    xmax] [N, 4] clipped to the image, status [N] str: 'ok', 'malformed', 'degenerate' or
    'outside') with coco_annotations.clip_box's rules, vectorised."""
    x, y, width, height = xywh.T
    status = np.full(len(xywh), 'ok', dtype=object)
    malformed = ~np.all(np.isfinite(xywh), axis=1)
    degenerate = ~malformed & ((width <= 0) | (height <= 0))
    with np.errstate(invalid='ignore'):
        boxes = np.stack([np.maximum(y, 0), np.maximum(x, 0),
                          np.minimum(y + height, image_sizes[:, 0]),
                          np.minimum(x + width, image_sizes[:, 1])], axis=1)
        outside = ~malformed & ~degenerate & ((boxes[:, 2] <= boxes[:, 0]) |
                                              (boxes[:, 3] <= boxes[:, 1]))
    status[malformed], status[degenerate], status[outside] = 'malformed', 'degenerate', 'outside'
    return boxes, status


def _box_set(xywh, class_index, is_crowd, image_index, image_sizes, names, source):
    boxes, status = clip_pixel_boxes(xywh, image_sizes[image_index])
    keep = status == 'ok'
    skipped = {reason: int(np.sum(status == reason))
               for reason in ('malformed', 'degenerate', 'outside')}
    return BoxSet(boxes[keep], class_index[keep], is_crowd[keep], image_index[keep],
                  image_sizes, names, source, skipped)


def load_coco(json_path: str) -> BoxSet:
    """Reads a COCO instances JSON (only its annotations; no image is opened)."""
    try:
        content = coco_annotations.load_coco_json(json_path)
        images = coco_annotations.index_images(content['images'], json_path)
        categories = coco_annotations.index_categories(content['categories'], json_path)
    except coco_annotations.ConversionError as error:
        raise DoctorInputError(str(error).replace('--object_annotations_file',
                                                  '--annotations')) from None
    label_map = label_map_lib.LabelMap.from_categories(categories.values())
    image_row = {image_id: row for row, image_id in enumerate(images)}
    class_of = {cid: label - 1 for cid, label in label_map.category_id_to_label.items()}
    annotations = content['annotations']
    image_index = _lookup(annotations, 'image_id', image_row, json_path, 'images')
    class_index = _lookup(annotations, 'category_id', class_of, json_path, 'categories')
    is_crowd = np.fromiter((bool(a.get('iscrowd', 0)) for a in annotations), bool,
                           len(annotations))
    image_sizes = np.array([[image['height'], image['width']] for image in images.values()],
                           dtype=np.int64).reshape(-1, 2)
    names = [label_map.label_to_name[label] for label in range(1, label_map.num_classes + 1)]
    return _box_set(_coco_boxes(annotations), class_index, is_crowd, image_index,
                    image_sizes, names, json_path)


def _record_fields(example, where):
    """(height, width, boxes [n, 4] normalised, labels [n], crowd [n], names [n]) of a record."""
    feature = example.features.feature

    def values(key, kind):
        return list(getattr(feature[key], kind).value) if key in feature else []
    height, width = values(fmt.IMAGE_HEIGHT, 'int64_list'), values(fmt.IMAGE_WIDTH, 'int64_list')
    if not height or not width:
        raise DoctorInputError(f'{where} has no {fmt.IMAGE_HEIGHT} / {fmt.IMAGE_WIDTH}: the '
                               f'doctor needs the image size without decoding the image; '
                               f'{CONVERTER_HINT}')
    boxes = np.array([values(key, 'float_list') for key in (
        fmt.OBJECT_BBOX_YMIN, fmt.OBJECT_BBOX_XMIN, fmt.OBJECT_BBOX_YMAX, fmt.OBJECT_BBOX_XMAX)],
        dtype=np.float64).T.reshape(-1, 4)
    labels = np.array(values(fmt.OBJECT_CLASS_LABEL, 'int64_list'), dtype=np.int64)
    crowd = np.array(values(fmt.OBJECT_IS_CROWD, 'int64_list') or [0] * len(labels), bool)
    names = [text.decode('utf-8') for text in values(fmt.OBJECT_CLASS_TEXT, 'bytes_list')]
    if not len(boxes) == len(labels) == len(crowd):
        raise DoctorInputError(f'{where} has {len(boxes)} boxes, {len(labels)} labels and '
                               f'{len(crowd)} crowd flags; rewrite it with the converter.')
    return height[0], width[0], boxes, labels, crowd, names


def _class_names(file_pattern, max_label, names_seen):
    """Names by class index: the label map beside the shards, else the records' class text."""
    path = label_map_lib.label_map_path_for(file_pattern)
    if path:
        label_map = label_map_lib.load_label_map(path)
        if max_label > label_map.num_classes:
            raise DoctorInputError(f'a record in {file_pattern} has label {max_label} but the '
                                   f'label map {path} lists {label_map.num_classes} classes.')
        return [label_map.label_to_name[label] for label in range(1, label_map.num_classes + 1)]
    return [names_seen.get(label, 'class %d' % label) for label in range(1, max_label + 1)]


def _read_records(file_pattern, max_records):
    """Yields (height, width, boxes [n, 4] pixels, labels, crowd, names) per record."""
    paths = tfrecord_framing.list_shards(file_pattern)  # The input pipeline's glob rules.
    if not paths:
        raise DoctorInputError(f'no TFRecord files match --file_pattern={file_pattern}; '
                               f'{CONVERTER_HINT}')
    records = tf.data.TFRecordDataset(paths)
    if max_records:
        records = records.take(max_records)
    iterator = records.as_numpy_iterator()
    for index in itertools.count():
        try:
            serialized = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            raise DoctorInputError(f'record {index} of --file_pattern={file_pattern} cannot be '
                                   f'read: {error.message.splitlines()[0]}') from None
        height, width, boxes, labels, crowd, names = _record_fields(
            tf.train.Example.FromString(serialized), f'record {index} of {file_pattern}')
        yield height, width, boxes * [height, width, height, width], labels, crowd, names


def load_records(file_pattern: str, max_records: Optional[int] = None) -> BoxSet:
    """Reads the converter's TFRecords (glob or comma-separated globs); images are not decoded.

    max_records: read only the first ones (sorted file order), e.g. for a quick look.
    """
    sizes, boxes, labels, crowd, image_index, names_seen = [], [], [], [], [], {}
    for height, width, image_boxes, image_labels, image_crowd, names in _read_records(
            file_pattern, max_records):
        names_seen.update(zip(image_labels.tolist(), names))
        image_index.append(np.full(len(image_labels), len(sizes)))
        sizes.append((height, width))
        boxes.append(image_boxes)
        labels.append(image_labels)
        crowd.append(image_crowd)
    boxes = np.concatenate(boxes + [np.zeros((0, 4))])
    labels, crowd, image_index = (np.concatenate(parts + [np.zeros(0, np.int64)]).astype(np.int64)
                                  for parts in (labels, crowd, image_index))
    if len(labels) and labels.min() < 1:
        raise DoctorInputError(f'a record in {file_pattern} has label {labels.min()}; labels '
                               f'are 1..num_classes. {CONVERTER_HINT}')
    class_names = _class_names(file_pattern, int(labels.max(initial=0)), names_seen)
    xywh = np.stack([boxes[:, 1], boxes[:, 0], boxes[:, 3] - boxes[:, 1],
                     boxes[:, 2] - boxes[:, 0]], axis=1)
    return _box_set(xywh, labels - 1, crowd.astype(bool), image_index,
                    np.array(sizes, np.int64).reshape(-1, 2), class_names, file_pattern)


def load_boxes(annotations=None, file_pattern=None, max_records=None):
    """BoxSet of a COCO JSON (`annotations`) or of TFRecords (`file_pattern`), not both."""
    if bool(annotations) == bool(file_pattern):
        raise DoctorInputError('give exactly one of --annotations=instances.json (COCO) or '
                               '--file_pattern=GLOB (TFRecords from dataset.create_coco_tfrecord)')
    if annotations:
        return load_coco(annotations)
    return load_records(file_pattern, max_records)
