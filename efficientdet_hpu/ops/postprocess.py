"""In-graph detection post-processing: decode, NMS, detection rows.

Pure TensorFlow (no py_func), so it runs in Estimator PREDICT/EVAL graphs and in
an exported SavedModel. Output rows follow docs/CONTRACTS.md:
`[image_id, ymin, xmin, ymax, xmax, score, label]`, boxes in original image
pixels, label = class index + 1.

Both of google/automl's paths (efficientdet/tf2/postprocess.py), chosen by arguments:
  per class (class_agnostic=False)  NMS within each class, then the best max_output_size
                                    over all classes: automl's COCO-eval path
                                    (postprocess_per_class / per_class_nms);
  class-agnostic (True)             one NMS over all candidates, boxes clipped to the
                                    network input before scaling: automl's serving and export
                                    path (postprocess_global).
Candidates: the max_nms_inputs best (anchor, class) pairs, or with 0 every anchor with its
best class (automl's pre_nms). This project adds clipping to the original image.
"""

import tensorflow as tf

from efficientdet_hpu.ops import box_ops

NMS_METHODS = ('hard', 'gaussian')


def generate_detections(class_outputs, box_outputs, anchor_boxes, image_ids, image_scales,
                        image_sizes=None, *, num_classes, method='hard', iou_thresh=0.5,
                        score_thresh=0.001, sigma=0.5, max_nms_inputs=5000,
                        max_output_size=100, class_agnostic=False, clip_to_image=True,
                        network_size=None):
    """Turns raw per-level network outputs into padded detection rows.

    Args:
      class_outputs: {level: [B, h, w, A*num_classes]} logits, any float dtype.
      box_outputs: {level: [B, h, w, A*4]} codes [ty, tx, th, tw].
      anchor_boxes: float [num_anchors, 4] [ymin, xmin, ymax, xmax] network-input
        pixels, in the level/y/x/anchor order of `anchors.generate_anchor_boxes`.
      image_ids: [B] integer or float image ids (float32 in the rows: exact up to 2**24).
      image_scales: float [B]; network-input pixels * scale = original pixels.
      image_sizes: optional int/float [B, 2] original (height, width); with clip_to_image,
        boxes are clipped to it after scaling.
      num_classes: C.
      method: 'hard' NMS, or 'gaussian' soft-NMS (score *= exp(-iou**2 / sigma)).
      iou_thresh: hard-NMS IoU threshold (unused by 'gaussian').
      score_thresh: keep scores strictly above this (>= 0).
      sigma: gaussian soft-NMS width.
      max_nms_inputs: K > 0: the K best (anchor, class) pairs by logit are the NMS
        candidates; 0: every anchor, with its best class (automl's max_nms_inputs=0).
      max_output_size: detections per image.
      class_agnostic: one NMS over all classes (automl's serving path) instead of per class.
      clip_to_image: clip boxes to image_sizes (ignored without image_sizes).
      network_size: (height, width) of the network input, where class_agnostic clips boxes
        before scaling; default: the first level's static output size * 2**level.

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
    nms_kwargs = _nms_settings(method, iou_thresh, score_thresh, sigma, max_output_size)
    if class_agnostic:
        nms_one_image = lambda args: _nms_all_classes(*args, **nms_kwargs)
    else:
        nms_one_image = lambda args: _nms_per_class(*args, num_classes=num_classes,
                                                    **nms_kwargs)
    det_boxes, det_scores, det_classes = tf.map_fn(
        nms_one_image, (boxes, scores, classes),
        fn_output_signature=(tf.TensorSpec([max_output_size, 4], tf.float32),
                             tf.TensorSpec([max_output_size], tf.float32),
                             tf.TensorSpec([max_output_size], tf.int32)))
    if class_agnostic:
        height, width = network_size or _network_size(class_outputs)
        det_boxes = tf.clip_by_value(det_boxes, 0.0, tf.constant(
            [height, width, height, width], tf.float32))
    return _detection_rows(det_boxes, det_scores, det_classes, image_ids, image_scales,
                           image_sizes if clip_to_image else None)


def _network_size(class_outputs):
    level = min(class_outputs)
    height, width = class_outputs[level].shape[1:3]
    if height is None or width is None:
        raise ValueError('class_agnostic needs network_size (the outputs have no static size)')
    return height * 2 ** level, width * 2 ** level


def _nms_settings(method, iou_thresh, score_thresh, sigma, max_output_size):
    """Keyword arguments of `_nms_padded` for a method."""
    settings = dict(max_output_size=max_output_size, score_thresh=float(score_thresh))
    if method == 'hard':
        settings.update(iou_thresh=float(iou_thresh), soft_nms_sigma=0.0)
    else:
        # tf.image NMS weights by exp(-0.5 * iou**2 / s); s = sigma / 2 gives the
        # reference's exp(-iou**2 / sigma). Soft-NMS never suppresses by IoU threshold.
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
    K * C pairs, are the K best pairs (ties aside). Without it, every anchor in order with
    its best class (the first on ties), as automl's pre_nms.
    """
    if not max_nms_inputs:
        boxes = box_ops.decode_boxes(codes, anchor_boxes[None])
        return (boxes, tf.sigmoid(tf.reduce_max(logits, axis=2)),
                tf.argmax(logits, axis=2, output_type=tf.int32))
    batch = tf.shape(logits)[0]
    anchor_index = _top_anchors(logits, max_nms_inputs)                       # [B, k]
    anchor_logits = tf.gather(logits, anchor_index, batch_dims=1)             # [B, k, C]
    num_pairs = _static_or_dynamic_size(anchor_logits, 1) * num_classes
    pair_logits, pair = tf.math.top_k(
        tf.reshape(anchor_logits, [batch, -1]), k=_min(max_nms_inputs, num_pairs), sorted=False)
    anchor_index = tf.gather(anchor_index, pair // num_classes, batch_dims=1)
    boxes = box_ops.decode_boxes(tf.gather(codes, anchor_index, batch_dims=1),
                                 tf.gather(anchor_boxes, anchor_index))
    return boxes, tf.sigmoid(pair_logits), pair % num_classes


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


def _nms_padded(boxes, scores, *, max_output_size, score_thresh, iou_thresh, soft_nms_sigma):
    """TensorFlow's NMS (hard or soft) of one set of boxes, as automl calls it.

    boxes float32 [K, 4] network pixels, scores float32 [K] -> (index int32 [M] into the K,
    score float32 [M] after soft-NMS decay, -1 on padding), best first, M = max_output_size.
    Boxes are not clamped: an untrained network's boxes far outside the image overlap as
    automl computes them (a box of infinite size has IoU 0 or NaN, never suppresses).
    """
    index, kept, count = tf.raw_ops.NonMaxSuppressionV5(
        boxes=boxes, scores=scores,
        max_output_size=max_output_size, iou_threshold=iou_thresh,
        score_threshold=score_thresh, soft_nms_sigma=soft_nms_sigma,
        pad_to_max_output_size=True)
    return index, tf.where(tf.range(max_output_size) < count, kept, -1.0)


def _nms_all_classes(boxes, scores, classes, **nms):
    """One NMS over every candidate of one image, whatever its class (automl's serving path).
    boxes [K, 4], scores [K], classes int32 [K] -> boxes [M, 4], scores [M] (-1 on padding),
    classes [M]."""
    index, kept = _nms_padded(boxes, scores, **nms)
    return tf.gather(boxes, index), kept, tf.gather(classes, index)


def _nms_per_class(boxes, scores, classes, *, num_classes, max_output_size, score_thresh,
                   **nms):
    """NMS within each class of one image, each class's candidates in their given order,
    then the best max_output_size of all classes by score (automl's per_class_nms; on equal
    scores the lower class first). Shapes as _nms_all_classes."""
    # Only candidates above the threshold take part in any NMS: each class scans those.
    above = tf.cast(tf.where(scores > score_thresh)[:, 0], tf.int32)
    above_classes = tf.gather(classes, above)

    def one_class(class_index):
        members = tf.gather(above, tf.where(tf.equal(above_classes, class_index))[:, 0])
        index, kept = _nms_padded(tf.gather(boxes, members), tf.gather(scores, members),
                                  max_output_size=max_output_size, score_thresh=score_thresh,
                                  **nms)
        # The 0 past the end keeps padding rows' gather in range when the class is empty.
        return tf.gather(tf.concat([members, [0]], 0), index), kept

    members, kept = tf.map_fn(one_class, tf.range(num_classes), fn_output_signature=(
        tf.TensorSpec([max_output_size], tf.int32), tf.TensorSpec([max_output_size], tf.float32)))
    best_scores, best = tf.math.top_k(tf.reshape(kept, [-1]), k=max_output_size)
    index = tf.gather(tf.reshape(members, [-1]), best)
    return tf.gather(boxes, index), best_scores, tf.gather(classes, index)


def _detection_rows(boxes, scores, classes, image_ids, image_scales, image_sizes):
    """Assembles [B, M, 7] rows in original pixels; padding rows become zero. Clipped to
    image_sizes when given, a box that lay wholly outside the photo (in the padding of the
    network input) keeps no area: it is dropped, the rows after it move up (their order
    kept), and the count falls."""
    valid = scores >= 0.0                                          # [B, M]
    scales = tf.reshape(tf.cast(image_scales, tf.float32), [-1, 1, 1])
    boxes = boxes * scales
    if image_sizes is not None:
        boxes = box_ops.clip_boxes(boxes, tf.reshape(image_sizes, [-1, 1, 2]))
        valid &= (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
    ids = tf.cast(tf.reshape(image_ids, [-1, 1]), tf.float32) * tf.ones_like(scores)
    labels = tf.cast(classes + 1, tf.float32)
    rows = tf.concat([ids[..., None], boxes, scores[..., None], labels[..., None]], axis=-1)
    rows = tf.where(valid[..., None], rows, tf.zeros_like(rows))
    if image_sizes is not None:  # The kept rows first, in their order.
        order = tf.argsort(tf.cast(valid, tf.int32), axis=1, direction='DESCENDING',
                           stable=True)
        rows = tf.gather(rows, order, batch_dims=1)
    return rows, tf.reduce_sum(tf.cast(valid, tf.int32), axis=1)
