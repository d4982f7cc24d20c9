"""Box geometry as plain TensorFlow functions: IoU, Faster R-CNN coding, clipping.

Every box is `[ymin, xmin, ymax, xmax]` in one coordinate frame (absolute pixels
or normalised, as long as both arguments agree). All functions are pure tensor
code: they run eagerly, inside `tf.compat.v1` graphs and inside `tf.data` maps.
"""

import tensorflow as tf

# Added to every height/width before dividing or taking a log, so zero-size anchors
# or boxes give finite codes. Far below float32 resolution for real pixel sizes,
# so an encode -> decode round trip is unaffected.
_EPSILON = 1e-8


def _check_last_dim(tensor, name):
    last = tensor.shape[-1] if tensor.shape.rank else None
    if last is not None and last != 4:
        raise ValueError('%s must have last dimension 4 ([ymin, xmin, ymax, xmax]), '
                         'got shape %s' % (name, tensor.shape))


def _to_center_size(boxes):
    """[..., 4] corners -> (y_center, x_center, height, width), each [...]."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, num=4, axis=-1)
    return (ymin + ymax) / 2.0, (xmin + xmax) / 2.0, ymax - ymin, xmax - xmin


def encode_boxes(boxes, anchors):
    """Faster R-CNN box codes of `boxes` relative to `anchors` (no scale factors).

    ty = (yc - yc_a) / h_a, tx = (xc - xc_a) / w_a, th = log(h / h_a),
    tw = log(w / w_a).

    Args:
      boxes: float tensor [..., 4], [ymin, xmin, ymax, xmax].
      anchors: float tensor broadcastable to `boxes`, same box order and frame.

    Returns:
      float tensor [..., 4] of codes [ty, tx, th, tw].
    """
    boxes = tf.convert_to_tensor(boxes)
    anchors = tf.convert_to_tensor(anchors, dtype=boxes.dtype)
    _check_last_dim(boxes, 'boxes')
    _check_last_dim(anchors, 'anchors')
    yc, xc, h, w = _to_center_size(boxes)
    yc_a, xc_a, h_a, w_a = _to_center_size(anchors)
    h_a += _EPSILON
    w_a += _EPSILON
    h += _EPSILON
    w += _EPSILON
    return tf.stack([(yc - yc_a) / h_a, (xc - xc_a) / w_a,
                     tf.math.log(h / h_a), tf.math.log(w / w_a)], axis=-1)


def decode_boxes(codes, anchors):
    """Inverse of `encode_boxes`: codes [ty, tx, th, tw] -> corner boxes.

    Args:
      codes: float tensor [..., 4], [ty, tx, th, tw].
      anchors: float tensor broadcastable to `codes`, [ymin, xmin, ymax, xmax].

    Returns:
      float tensor [..., 4], [ymin, xmin, ymax, xmax] in the anchors' frame.
    """
    codes = tf.convert_to_tensor(codes)
    anchors = tf.convert_to_tensor(anchors, dtype=codes.dtype)
    _check_last_dim(codes, 'codes')
    _check_last_dim(anchors, 'anchors')
    ty, tx, th, tw = tf.unstack(codes, num=4, axis=-1)
    yc_a, xc_a, h_a, w_a = _to_center_size(anchors)
    h_a += _EPSILON
    w_a += _EPSILON
    yc = ty * h_a + yc_a
    xc = tx * w_a + xc_a
    half_h = tf.exp(th) * h_a / 2.0
    half_w = tf.exp(tw) * w_a / 2.0
    return tf.stack([yc - half_h, xc - half_w, yc + half_h, xc + half_w], axis=-1)


def clip_boxes(boxes, image_size):
    """Clips boxes to the image rectangle [0, height] x [0, width].

    Args:
      boxes: float tensor [..., 4], [ymin, xmin, ymax, xmax] absolute pixels.
      image_size: tensor [..., 2] of (height, width), broadcastable against
        `boxes[..., :2]` (e.g. [2] for one image, [B, 1, 2] for boxes [B, K, 4]).

    Returns:
      float tensor shaped like `boxes`.
    """
    boxes = tf.convert_to_tensor(boxes)
    _check_last_dim(boxes, 'boxes')
    image_size = tf.cast(image_size, boxes.dtype)
    upper = tf.concat([image_size, image_size], axis=-1)
    return tf.minimum(tf.maximum(boxes, tf.zeros([], boxes.dtype)), upper)
