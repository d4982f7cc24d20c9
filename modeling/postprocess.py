"""In-graph detection post-processing: decode, per-class NMS, detection rows.

Pure TensorFlow (no py_func), so it runs in Estimator PREDICT/EVAL graphs and in
an exported SavedModel. Output rows follow docs/CONTRACTS.md:
`[image_id, ymin, xmin, ymax, xmax, score, label]`, boxes in original image
pixels, label = class index + 1.
"""

import math

import tensorflow as tf

from modeling import box_ops

NMS_METHODS = ('hard', 'gaussian')


def generate_detections(class_outputs, box_outputs, anchor_boxes, image_ids, image_scales,
                        image_sizes=None, *, num_classes, method='hard', iou_thresh=0.5,
                        score_thresh=0.001, sigma=0.5, max_nms_inputs=5000,
                        max_output_size=100):
    """Turns raw per-level network outputs into padded detection rows.

    Args:
      class_outputs: {level: [B, h, w, A*num_classes]} logits, any float dtype.
      box_outputs: {level: [B, h, w, A*4]} codes [ty, tx, th, tw].
      anchor_boxes: float [num_anchors, 4] [ymin, xmin, ymax, xmax] network-input
        pixels, in the level/y/x/anchor order of `anchors.generate_anchor_boxes`.
      image_ids: [B] integer or float image ids (float32 in the rows: exact up to 2**24).
      image_scales: float [B]; network-input pixels * scale = original pixels.
      image_sizes: optional int/float [B, 2] original (height, width); boxes are
        clipped to it after scaling.
      num_classes: C.
      method: 'hard' NMS, or 'gaussian' soft-NMS (score *= exp(-iou**2 / sigma)).
      iou_thresh: hard-NMS IoU threshold (unused by 'gaussian').
      score_thresh: keep scores strictly above this (>= 0).
      sigma: gaussian soft-NMS width.
      max_nms_inputs: top-k (anchor, class) pairs kept before NMS; 0 keeps all.
      max_output_size: detections per image.

    Returns:
      detections: float32 [B, max_output_size, 7] rows [image_id, ymin, xmin, ymax,
        xmax, score, label], sorted by score, padding rows all zero.
      num_detections: int32 [B] count of real rows.
    """
    if method not in NMS_METHODS:
        raise ValueError('NMS method %r is not one of %s' % (method, NMS_METHODS))
    if not score_thresh >= 0:
        raise ValueError('score_thresh must be >= 0, got %s' % score_thresh)
    logits = flatten_levels(class_outputs, num_classes)
    codes = flatten_levels(box_outputs, 4)
    anchor_boxes = tf.convert_to_tensor(anchor_boxes, tf.float32)
    if anchor_boxes.shape[0] is not None and codes.shape[1] is not None and (
        anchor_boxes.shape[0] != codes.shape[1]):
        raise ValueError('anchor_boxes has %d rows but the outputs hold %d anchors; build '
                         'anchors with the same image size, levels and anchor settings'
                         % (anchor_boxes.shape[0], codes.shape[1]))
    boxes, scores, classes = _candidates(logits, codes, anchor_boxes, num_classes,
                                         max_nms_inputs)
    extent = tf.reduce_max(tf.abs(anchor_boxes))
    nms_kwargs = _nms_settings(method, iou_thresh, score_thresh, sigma, max_output_size)
    det_boxes, det_scores, det_classes = tf.map_fn(
        lambda args: _nms_one_image(*args, extent=extent, num_classes=num_classes,
                                    **nms_kwargs),
        (boxes, scores, classes),
        fn_output_signature=(tf.TensorSpec([max_output_size, 4], tf.float32),
                             tf.TensorSpec([max_output_size], tf.float32),
                             tf.TensorSpec([max_output_size], tf.int32)))
    return _detection_rows(det_boxes, det_scores, det_classes, image_ids, image_scales,
                           image_sizes)


def _nms_settings(method, iou_thresh, score_thresh, sigma, max_output_size):
    """Keyword arguments of `_nms_one_image` for a method."""
    settings = dict(max_output_size=max_output_size, score_thresh=float(score_thresh))
    if method == 'hard':
        settings.update(iou_thresh=float(iou_thresh), soft_nms_sigma=0.0)
    else:
        # tf.image NMS weights by exp(-0.5 * iou**2 / s); s = sigma / 2 gives the
        # reference's exp(-iou**2 / sigma). IoU threshold 1 disables hard suppression.
        settings.update(iou_thresh=1.0, soft_nms_sigma=float(sigma) / 2.0)
    return settings


def flatten_levels(outputs, per_anchor):
    """{level: [B, h, w, A * per_anchor]} -> float32 [B, N, per_anchor], N = all levels'
    h * w * A in anchor order (level, y, x, anchor)."""
    batch = tf.shape(outputs[min(outputs)])[0]
    return tf.concat([tf.reshape(tf.cast(outputs[level], tf.float32), [batch, -1, per_anchor])
                      for level in sorted(outputs)], axis=1)


def _candidates(logits, codes, anchor_boxes, num_classes, max_nms_inputs):
    """(anchor, class) candidate pairs: boxes float32 [B, K, 4] (decoded, network pixels),
    scores float32 [B, K] (sigmoid), class index int32 [B, K].

    With max_nms_inputs, the K best pairs by logit, found in two cheap steps instead of one
    top-k over all N * C pairs: an anchor holding one of the K best pairs has its best class
    among the K best anchors' best classes (fewer than K pairs beat that pair, so fewer than
    K anchors' maxima can), so the K best anchors by max logit, then the K best of their
    K * C pairs, are the K best pairs (ties aside). Without it, all N * C pairs.
    """
    batch = tf.shape(logits)[0]
    if not max_nms_inputs:
        pair_logits = tf.reshape(logits, [batch, -1])
        pairs = tf.range(tf.shape(pair_logits)[1])[None] * tf.ones([batch, 1], tf.int32)
        anchor_index, class_index = pairs // num_classes, pairs % num_classes
    else:
        anchor_index = _top_anchors(logits, max_nms_inputs)                   # [B, k]
        anchor_logits = tf.gather(logits, anchor_index, batch_dims=1)         # [B, k, C]
        num_pairs = _static_or_dynamic_size(anchor_logits, 1) * num_classes
        pair_logits, pair = tf.math.top_k(
            tf.reshape(anchor_logits, [batch, -1]), k=_min(max_nms_inputs, num_pairs),
            sorted=False)
        anchor_index = tf.gather(anchor_index, pair // num_classes, batch_dims=1)
        class_index = pair % num_classes
    boxes = box_ops.decode_boxes(tf.gather(codes, anchor_index, batch_dims=1),
                                 tf.gather(anchor_boxes, anchor_index))
    return boxes, tf.sigmoid(pair_logits), class_index


def _top_anchors(logits, k):
    """Indices int32 [B, min(k, N)] of the anchors with the highest max-over-classes logit."""
    best_logits = tf.reduce_max(logits, axis=2)                               # [B, N]
    _, index = tf.math.top_k(best_logits, k=_min(k, _static_or_dynamic_size(logits, 1)),
                             sorted=False)
    return index


def _static_or_dynamic_size(tensor, axis):
    size = tensor.shape[axis]
    return size if size is not None else tf.shape(tensor)[axis]


def _min(a, b):
    """min() that keeps a static k static (static shapes downstream)."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return tf.minimum(a, b)


def _nms_one_image(boxes, scores, classes, *, extent, num_classes, max_output_size,
                   score_thresh, iou_thresh, soft_nms_sigma):
    """NMS per class of one image, the best `max_output_size` kept overall, in one pass.

    Each class's boxes are moved to their own cell of a grid of windows so that boxes of
    different classes never overlap: one NMS over all candidates then suppresses only
    within a class (IoU 0 neither passes a hard threshold nor decays a soft-NMS score), and
    its selection order (best score first) merges the per-class results.

    Args:
      boxes: float32 [K, 4] network pixels; scores float32 [K]; classes int32 [K].
      extent: float32 scalar, the largest |coordinate| of the anchors; candidate boxes are
        clamped to 8 * extent around the origin for NMS only (a box that decodes further
        out is degenerate; clamping keeps the per-class windows apart and float-precise).

    Returns:
      boxes [M, 4], scores [M] (sorted, -1 on padding), class index int32 [M].
    """
    limit = 8.0 * extent + 1.0
    window = 2.0 * limit + 1.0
    columns = int(math.ceil(math.sqrt(num_classes)))
    cell = tf.cast(tf.stack([classes // columns, classes % columns,
                             classes // columns, classes % columns], axis=1), tf.float32)
    separated = tf.clip_by_value(boxes, -limit, limit) + cell * window
    index, kept_scores = tf.image.non_max_suppression_with_scores(
        separated, scores, max_output_size, iou_threshold=iou_thresh,
        score_threshold=score_thresh, soft_nms_sigma=soft_nms_sigma)
    pad = max_output_size - tf.shape(index)[0]
    return (tf.pad(tf.gather(boxes, index), [[0, pad], [0, 0]]),
            tf.pad(kept_scores, [[0, pad]], constant_values=-1.0),
            tf.pad(tf.gather(classes, index), [[0, pad]]))


def _detection_rows(boxes, scores, classes, image_ids, image_scales, image_sizes):
    """Assembles [B, M, 7] rows in original pixels; padding rows become zero."""
    valid = scores >= 0.0                                          # [B, M]
    scales = tf.reshape(tf.cast(image_scales, tf.float32), [-1, 1, 1])
    boxes = boxes * scales
    if image_sizes is not None:
        boxes = box_ops.clip_boxes(boxes, tf.reshape(image_sizes, [-1, 1, 2]))
    ids = tf.cast(tf.reshape(image_ids, [-1, 1]), tf.float32) * tf.ones_like(scores)
    labels = tf.cast(classes + 1, tf.float32)
    rows = tf.concat([ids[..., None], boxes, scores[..., None], labels[..., None]], axis=-1)
    rows = tf.where(valid[..., None], rows, tf.zeros_like(rows))
    return rows, tf.reduce_sum(tf.cast(valid, tf.int32), axis=1)
