"""TFRecord schema for detection examples: feature keys and an Example builder.

The keys are the ones the TF Object Detection API and the reference EfficientDet ports use
(see docs/CONTRACTS.md), so records written by those tools load here and vice versa.
One `tf.train.Example` holds one image and all of its boxes.
"""
from typing import Sequence

import numpy as np
import tensorflow as tf

IMAGE_ENCODED = 'image/encoded'
IMAGE_FORMAT = 'image/format'
IMAGE_HEIGHT = 'image/height'
IMAGE_WIDTH = 'image/width'
IMAGE_SOURCE_ID = 'image/source_id'
IMAGE_FILENAME = 'image/filename'
OBJECT_BBOX_YMIN = 'image/object/bbox/ymin'
OBJECT_BBOX_XMIN = 'image/object/bbox/xmin'
OBJECT_BBOX_YMAX = 'image/object/bbox/ymax'
OBJECT_BBOX_XMAX = 'image/object/bbox/xmax'
OBJECT_CLASS_LABEL = 'image/object/class/label'
OBJECT_CLASS_TEXT = 'image/object/class/text'
OBJECT_IS_CROWD = 'image/object/is_crowd'
OBJECT_AREA = 'image/object/area'
# Written only for tiles of a larger photo (create_coco_tfrecord --tile_size): the tile's
# top-left corner in the photo's pixels and the photo's image id, to map boxes back.
TILE_ORIGIN_Y = 'image/tile/origin_y'
TILE_ORIGIN_X = 'image/tile/origin_x'
TILE_SOURCE_ID = 'image/tile/source_id'

JPEG_FORMAT = b'jpeg'


def _bytes_feature(values: Sequence[bytes]) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _int64_feature(values: Sequence[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _float_feature(values: Sequence[float]) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def _as_bytes(text) -> bytes:
    return text if isinstance(text, bytes) else str(text).encode('utf-8')


def build_example(encoded_jpeg: bytes, height: int, width: int, image_id: int, filename: str,
                  boxes_normalized, labels, names, is_crowd, areas, tile_origin=None,
                  tile_source_id=None) -> tf.train.Example:
    """Builds the Example for one image.

    Args:
        encoded_jpeg: RGB JPEG bytes of the stored image.
        height, width: pixel size of `encoded_jpeg`.
        image_id: the source (COCO) image id, any integer; stored as a decimal string.
        filename: file name as given in the annotation file.
        boxes_normalized: float array-like [N, 4], [ymin, xmin, ymax, xmax] in [0, 1] relative
            to (height, width). N may be 0 (a negative image); [] is accepted for that.
        labels: int [N], contiguous labels 1..num_classes (see data/label_map.py).
        names: str [N], category names.
        is_crowd: int [N], 0 or 1.
        areas: float [N], COCO area in original image pixels.
        tile_origin, tile_source_id: (y, x) of a tile's top-left corner in its photo and the
            photo's image id; both None (no tile keys) for a whole image.

    Returns:
        A `tf.train.Example` with the keys defined in this module.
    """
    boxes = np.asarray(boxes_normalized, dtype=np.float64)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f'build_example: boxes_normalized must be [N, 4], got shape '
                         f'{boxes.shape} (image id {image_id}, {filename!r}).')
    num_boxes = boxes.shape[0]
    for field_name, values in (('labels', labels), ('names', names), ('is_crowd', is_crowd),
                               ('areas', areas)):
        if len(values) != num_boxes:
            raise ValueError(f'build_example: {field_name} has {len(values)} entries for '
                             f'{num_boxes} boxes (image id {image_id}, {filename!r}).')
    feature = {
        IMAGE_ENCODED: _bytes_feature([encoded_jpeg]),
        IMAGE_FORMAT: _bytes_feature([JPEG_FORMAT]),
        IMAGE_HEIGHT: _int64_feature([height]),
        IMAGE_WIDTH: _int64_feature([width]),
        IMAGE_SOURCE_ID: _bytes_feature([_as_bytes(int(image_id))]),
        IMAGE_FILENAME: _bytes_feature([_as_bytes(filename)]),
        OBJECT_BBOX_YMIN: _float_feature(boxes[:, 0]),
        OBJECT_BBOX_XMIN: _float_feature(boxes[:, 1]),
        OBJECT_BBOX_YMAX: _float_feature(boxes[:, 2]),
        OBJECT_BBOX_XMAX: _float_feature(boxes[:, 3]),
        OBJECT_CLASS_LABEL: _int64_feature(labels),
        OBJECT_CLASS_TEXT: _bytes_feature([_as_bytes(name) for name in names]),
        OBJECT_IS_CROWD: _int64_feature(is_crowd),
        OBJECT_AREA: _float_feature(areas),
    }
    if tile_origin is not None:
        feature[TILE_ORIGIN_Y] = _int64_feature([tile_origin[0]])
        feature[TILE_ORIGIN_X] = _int64_feature([tile_origin[1]])
        feature[TILE_SOURCE_ID] = _bytes_feature([_as_bytes(int(tile_source_id))])
    return tf.train.Example(features=tf.train.Features(feature=feature))
