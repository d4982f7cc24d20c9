"""In-graph detection post-processing: decode, per-class NMS, detection rows.

Pure TensorFlow (no py_func), so it runs in Estimator PREDICT/EVAL graphs and in
an exported SavedModel. Output rows follow docs/CONTRACTS.md:
`[image_id, ymin, xmin, ymax, xmax, score, label]`, boxes in original image
pixels, label = class index + 1.
"""

import tensorflow as tf

import box_ops

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
    logits, codes = _flatten_levels(class_outputs, box_outputs, num_classes)
    anchor_boxes = tf.convert_to_tensor(anchor_boxes, tf.float32)
    if anchor_boxes.shape[0] is not None and codes.shape[1] is not None and (
        anchor_boxes.shape[0] != codes.shape[1]):
        raise ValueError('anchor_boxes has %d rows but the outputs hold %d anchors; build '
                         'anchors with the same image size, levels and anchor settings'
                         % (anchor_boxes.shape[0], codes.shape[1]))
    boxes, scores = _candidates(logits, codes, anchor_boxes, num_classes, max_nms_inputs)

    nms_kwargs = _nms_settings(method, iou_thresh, score_thresh, sigma, max_output_size)
    det_boxes, det_scores, det_classes = tf.map_fn(
        lambda args: _nms_one_image(args[0], args[1], **nms_kwargs), (boxes, scores),
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


def _flatten_levels(class_outputs, box_outputs, num_classes):
    """Levels -> logits float32 [B, N, C] and codes float32 [B, N, 4], anchor order."""
    logits, codes = [], []
    for level in sorted(class_outputs):
        level_logits = tf.cast(class_outputs[level], tf.float32)
        level_codes = tf.cast(box_outputs[level], tf.float32)
        batch = tf.shape(level_logits)[0]
        logits.append(tf.reshape(level_logits, [batch, -1, num_classes]))
        codes.append(tf.reshape(level_codes, [batch, -1, 4]))
    return tf.concat(logits, axis=1), tf.concat(codes, axis=1)


def _candidates(logits, codes, anchor_boxes, num_classes, max_nms_inputs):
    """Decoded candidate boxes [B, K, 4] and per-class scores [B, K, C].

    With a top-k pre-selection over (anchor, class) pairs, each candidate row keeps
    its one selected class score and -1 elsewhere, so the other classes' NMS skips it.
    """
    num_anchors = tf.shape(logits)[1]
    if not max_nms_inputs:
        boxes = box_ops.decode_boxes(codes, anchor_boxes[None])
        return boxes, tf.sigmoid(logits)
    flat_logits = tf.reshape(logits, [tf.shape(logits)[0], -1])   # [B, N*C]
    if logits.shape[1] is not None:  # static k keeps static shapes downstream
        k = min(max_nms_inputs, logits.shape[1] * num_classes)
    else:
        k = tf.minimum(max_nms_inputs, num_anchors * num_classes)
    top_logits, top_index = tf.math.top_k(flat_logits, k=k, sorted=False)
    anchor_index = top_index // num_classes
    class_index = top_index % num_classes
    boxes = box_ops.decode_boxes(tf.gather(codes, anchor_index, batch_dims=1),
                                 tf.gather(anchor_boxes, anchor_index))
    scores = tf.where(tf.one_hot(class_index, num_classes, on_value=True, off_value=False),
                      tf.sigmoid(top_logits)[..., None], -1.0)
    return boxes, scores


def _nms_one_image(boxes, scores, *, max_output_size, score_thresh, iou_thresh,
                   soft_nms_sigma):
    """Per-class NMS of one image, merged to the best `max_output_size` overall.

    Args:
      boxes: float32 [K, 4]; scores: float32 [K, C] (negative = not a candidate).

    Returns:
      boxes [M, 4], scores [M] (sorted, -1 on padding), class index int32 [M].
    """
    def one_class(class_scores):
        index, kept_scores = tf.image.non_max_suppression_with_scores(
            boxes, class_scores, max_output_size, iou_threshold=iou_thresh,
            score_threshold=score_thresh, soft_nms_sigma=soft_nms_sigma)
        pad = max_output_size - tf.shape(index)[0]
        return (tf.pad(index, [[0, pad]]),
                tf.pad(kept_scores, [[0, pad]], constant_values=-1.0))

    index, kept_scores = tf.map_fn(
        one_class, tf.transpose(scores),
        fn_output_signature=(tf.TensorSpec([max_output_size], tf.int32),
                             tf.TensorSpec([max_output_size], tf.float32)))  # [C, M]
    best_scores, best = tf.math.top_k(tf.reshape(kept_scores, [-1]), k=max_output_size)
    best_boxes = tf.gather(boxes, tf.gather(tf.reshape(index, [-1]), best))
    return best_boxes, best_scores, best // max_output_size


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
