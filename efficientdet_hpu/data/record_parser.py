"""Reading a detection record back, as the input pipeline does: parse one tf.train.Example
(data/tfrecord_format.py's keys) into dense tensors with the record checked, decode its
image, and build the ground-truth rows evaluation needs. All TensorFlow ops, so they run inside
tf.data and inside an exported serving graph alike."""
import tensorflow as tf

from efficientdet_hpu.data import tfrecord_format as fmt

CONVERTER_HINT = ('create them with: python -m dataset.create_coco_tfrecord --image_dir=DIR '
                  '--object_annotations_file=instances.json --output_file_prefix=PREFIX')
_BOX_KEYS = (fmt.OBJECT_BBOX_YMIN, fmt.OBJECT_BBOX_XMIN, fmt.OBJECT_BBOX_YMAX,
             fmt.OBJECT_BBOX_XMAX)
_RECORD_FEATURES = dict(
    {key: tf.io.VarLenFeature(tf.float32) for key in _BOX_KEYS + (fmt.OBJECT_AREA,)},
    **{fmt.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string, default_value=''),
       fmt.IMAGE_SOURCE_ID: tf.io.FixedLenFeature([], tf.string, default_value=''),
       fmt.OBJECT_CLASS_LABEL: tf.io.VarLenFeature(tf.int64),
       fmt.OBJECT_IS_CROWD: tf.io.VarLenFeature(tf.int64)})


_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def decode_image(encoded):
    """JPEG (direct) or PNG/GIF/BMP bytes -> uint8 [H, W, 3] RGB.

    The default (accurate) DCT everywhere: with TF's libjpeg-turbo, INTEGER_FAST measured
    no faster on 640x480 photos, and train/eval/inference then decode identically. A PNG's
    alpha is composited on black, as the converter does (data/image_codec.py), so a
    transparent PNG sent to an exported model looks as it did in training, not as the colours
    hidden under its transparent pixels.
    """
    is_png = tf.equal(tf.strings.substr(encoded, 0, len(_PNG_SIGNATURE)), _PNG_SIGNATURE)
    image = tf.case([
        (tf.io.is_jpeg(encoded), lambda: tf.io.decode_jpeg(encoded, channels=3)),
        (is_png, lambda: _composite_on_black(tf.io.decode_png(encoded, channels=4)))],
        default=lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False))
    image.set_shape([None, None, 3])
    return image


def _composite_on_black(rgba):
    """uint8 [H, W, 4] -> uint8 [H, W, 3]: colour * alpha / 255, rounded."""
    rgb = tf.cast(rgba[..., :3], tf.float32) * tf.cast(rgba[..., 3:], tf.float32) / 255.0
    return tf.cast(tf.round(rgb), tf.uint8)


def _optional(values, num_boxes, default):
    return tf.cond(tf.size(values) > 0, lambda: values, lambda: default)


def parse_record(serialized, file_pattern, num_classes):
    """One serialized tf.train.Example -> dict of dense tensors, with the record checked.

    Returns keys: encoded string, source_id int64, boxes float32 [N, 4] normalised,
    labels int32 [N] (1..num_classes), is_crowd int32 [N], area float32 [N] (-1 where the
    record has none: filled in original pixels by the caller).
    """
    parsed = tf.io.parse_single_example(serialized, _RECORD_FEATURES)
    dense = {key: tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor) else value
             for key, value in parsed.items()}
    labels = tf.cast(dense[fmt.OBJECT_CLASS_LABEL], tf.int32)
    num_boxes = tf.size(labels)
    is_crowd = _optional(tf.cast(dense[fmt.OBJECT_IS_CROWD], tf.int32), num_boxes,
                         tf.zeros([num_boxes], tf.int32))
    area = _optional(dense[fmt.OBJECT_AREA], num_boxes, -tf.ones([num_boxes], tf.float32))
    where = 'a record in %s' % file_pattern
    lengths = tf.stack([tf.size(dense[key]) for key in _BOX_KEYS]
                       + [tf.size(is_crowd), tf.size(area)])
    checks = [
        tf.debugging.Assert(tf.strings.length(dense[fmt.IMAGE_ENCODED]) > 0, [
            "%s has no '%s' (required); %s" % (where, fmt.IMAGE_ENCODED, CONVERTER_HINT)]),
        tf.debugging.Assert(
            tf.strings.regex_full_match(dense[fmt.IMAGE_SOURCE_ID], '-?[0-9]+'),
            ["%s has no integer '%s' (required, the COCO image id); got:" % (
                where, fmt.IMAGE_SOURCE_ID), dense[fmt.IMAGE_SOURCE_ID]]),
        tf.debugging.Assert(tf.reduce_all(tf.equal(lengths, num_boxes)), [
            "%s has lists of different lengths among '%s', %s, '%s' and '%s'; lengths:" % (
                where, fmt.OBJECT_CLASS_LABEL, ', '.join("'%s'" % k for k in _BOX_KEYS),
                fmt.OBJECT_IS_CROWD, fmt.OBJECT_AREA), num_boxes, lengths]),
        tf.debugging.Assert(tf.reduce_all((labels >= 1) & (labels <= num_classes)), [
            "%s has a '%s' outside 1..num_classes=%d; set num_classes to the label map's. "
            "Labels:" % (where, fmt.OBJECT_CLASS_LABEL, num_classes), labels]),
    ]
    with tf.control_dependencies(checks):
        return {'encoded': tf.identity(dense[fmt.IMAGE_ENCODED]),
                'source_id': tf.strings.to_number(dense[fmt.IMAGE_SOURCE_ID], tf.int64),
                'boxes': tf.stack([dense[key] for key in _BOX_KEYS], axis=1),
                'labels': labels, 'is_crowd': is_crowd, 'area': area}


def groundtruth_rows(record, original_size, max_instances, truncate):
    """float32 [max_instances, 7] rows [ymin, xmin, ymax, xmax, is_crowd, area, label] in
    original pixels, padding rows -1. More boxes than rows: truncated if `truncate` (the
    rows only serve evaluation), else an error (evaluation would silently lose boxes)."""
    size = tf.cast(original_size, tf.float32)
    boxes = record['boxes'] * tf.tile(size, [2])
    box_area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    area = tf.where(record['area'] < 0, box_area, record['area'])
    rows = tf.concat([boxes, tf.cast(record['is_crowd'], tf.float32)[:, None], area[:, None],
                      tf.cast(record['labels'], tf.float32)[:, None]], axis=1)
    if truncate:
        rows = rows[:max_instances]
    else:
        check = tf.debugging.Assert(tf.shape(rows)[0] <= max_instances, [
            'an image has more boxes than max_instances_per_image=%d; raise it with '
            '--hparams=max_instances_per_image=N. source_id, boxes:' % max_instances,
            record['source_id'], tf.shape(rows)[0]])
        with tf.control_dependencies([check]):
            rows = tf.identity(rows)
    rows = tf.pad(rows, [[0, max_instances - tf.shape(rows)[0]], [0, 0]], constant_values=-1.0)
    rows.set_shape([max_instances, 7])
    return rows
