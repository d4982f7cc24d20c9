"""Detection losses as pure functions: focal, Huber box, IoU-family, and their sum.

Targets follow docs/CONTRACTS.md: per level, cls_targets int32 [B, h, w, A]
(class index for positives, -1 negative, -2 ignored) and box_targets float32
[B, h, w, A*4] Faster R-CNN codes [ty, tx, th, tw]. Everything is computed in
float32 whatever the dtype of the network outputs.
"""

import math

import tensorflow as tf

from efficientdet_hpu.ops import box_ops

IOU_LOSS_TYPES = ('none', 'iou', 'giou', 'diou', 'ciou')
_IGNORED = -2


def focal_loss(logits, targets_one_hot, alpha=0.25, gamma=1.5, label_smoothing=0.0):
    """Sigmoid focal loss per element (not reduced, not normalised).

    As the reference, the focal weights (alpha_t, (1 - p_t)**gamma) use the hard
    targets and only the cross-entropy sees the smoothed ones, t*(1-s) + 0.5*s.

    Args:
      logits: float tensor [...], any float dtype (cast to float32).
      targets_one_hot: float tensor of 0/1, same shape as `logits`.
      alpha: weight of positive entries (1 - alpha for negatives).
      gamma: focusing exponent.
      label_smoothing: s in [0, 1].

    Returns:
      float32 tensor shaped like `logits`.
    """
    logits = tf.cast(logits, tf.float32)
    targets = tf.cast(targets_one_hot, tf.float32)
    # 1 - p_t = t*(1 - p) + (1 - t)*p, with 1 - p taken as sigmoid(-x): the same
    # value as the reference's 1 - p_t without float32 cancellation for confident
    # logits.
    one_minus_p_t = targets * tf.sigmoid(-logits) + (1.0 - targets) * tf.sigmoid(logits)
    alpha_t = targets * alpha + (1.0 - targets) * (1.0 - alpha)
    modulating = nonnegative_power(one_minus_p_t, gamma)
    smoothed = targets * (1.0 - label_smoothing) + 0.5 * label_smoothing
    cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits(labels=smoothed, logits=logits)
    return alpha_t * modulating * cross_entropy


def nonnegative_power(x, gamma):
    """x ** gamma for a float tensor x >= 0 and a Python number gamma.

    Integer and half-integer gamma >= 1 (the focal loss's 1.5, 2) are computed with multiplies
    and one square root: `tf.pow` per element was the most expensive node of a D0 training
    step on CPU (105 ms of 1060, docs/dev/training-step-profile.md), a sqrt ~15x cheaper. The
    gradient stays finite at x = 0 (sqrt's argument is floored at 1e-30 there).
    """
    twice = 2.0 * gamma
    if gamma < 1.0 or twice != int(twice):
        return tf.pow(x, gamma)
    result = x
    for _ in range(int(gamma) - 1):
        result = result * x
    if int(twice) % 2:
        result = result * tf.sqrt(tf.maximum(x, 1e-30))
    return result


def huber_box_loss(box_outputs, box_targets, delta=0.1):
    """Huber loss summed over entries whose target code is nonzero (as the reference).

    Args:
      box_outputs: float tensor [..., 4k] predicted codes [ty, tx, th, tw].
      box_targets: float tensor, same shape; 0 marks "no target".
      delta: switch point between the quadratic and linear parts.

    Returns:
      float32 scalar: sum of 0.5*d^2 (|d| <= delta) or delta*(|d| - 0.5*delta).
    """
    box_outputs = tf.cast(box_outputs, tf.float32)
    box_targets = tf.cast(box_targets, tf.float32)
    abs_error = tf.abs(box_outputs - box_targets)
    quadratic = tf.minimum(abs_error, delta)
    linear = abs_error - quadratic
    per_entry = 0.5 * tf.square(quadratic) + delta * linear
    mask = tf.cast(tf.not_equal(box_targets, 0.0), tf.float32)
    return tf.reduce_sum(per_entry * mask)


def iou_loss(pred_boxes, target_boxes, iou_type):
    """1 - {IoU, GIoU, DIoU, CIoU} per box pair (not reduced, not masked).

    Args:
      pred_boxes: float tensor [..., 4], [ymin, xmin, ymax, xmax] decoded boxes.
      target_boxes: float tensor [..., 4], same frame.
      iou_type: one of 'iou', 'giou', 'diou', 'ciou'.

    Returns:
      float32 tensor [...].
    """
    if iou_type not in IOU_LOSS_TYPES[1:]:
        raise ValueError('iou_type %r is not one of %s' % (iou_type, IOU_LOSS_TYPES[1:]))
    pred = tf.unstack(tf.cast(pred_boxes, tf.float32), num=4, axis=-1)
    target = tf.unstack(tf.cast(target_boxes, tf.float32), num=4, axis=-1)
    p_h, p_w = tf.nn.relu(pred[2] - pred[0]), tf.nn.relu(pred[3] - pred[1])
    t_h, t_w = tf.nn.relu(target[2] - target[0]), tf.nn.relu(target[3] - target[1])
    inter_h = tf.nn.relu(tf.minimum(pred[2], target[2]) - tf.maximum(pred[0], target[0]))
    inter_w = tf.nn.relu(tf.minimum(pred[3], target[3]) - tf.maximum(pred[1], target[1]))
    intersection = inter_h * inter_w
    union = p_h * p_w + t_h * t_w - intersection
    iou = tf.math.divide_no_nan(intersection, union)
    if iou_type == 'iou':
        return 1.0 - iou
    enclose_h = tf.maximum(pred[2], target[2]) - tf.minimum(pred[0], target[0])
    enclose_w = tf.maximum(pred[3], target[3]) - tf.minimum(pred[1], target[1])
    if iou_type == 'giou':
        enclose_area = enclose_h * enclose_w
        return 1.0 - iou + tf.math.divide_no_nan(enclose_area - union, enclose_area)
    centre_dist_sq = (tf.square((pred[0] + pred[2] - target[0] - target[2]) / 2.0) +
                      tf.square((pred[1] + pred[3] - target[1] - target[3]) / 2.0))
    diag_sq = tf.square(enclose_h) + tf.square(enclose_w)
    diou_penalty = tf.math.divide_no_nan(centre_dist_sq, diag_sq)
    if iou_type == 'diou':
        return 1.0 - iou + diou_penalty
    aspect_gap = (tf.atan(tf.math.divide_no_nan(t_w, t_h)) -
                  tf.atan(tf.math.divide_no_nan(p_w, p_h)))
    v = 4.0 / math.pi ** 2 * tf.square(aspect_gap)
    # The CIoU trade-off weight is a constant in the paper's gradient.
    trade_off = tf.stop_gradient(tf.math.divide_no_nan(v, 1.0 - iou + v))
    return 1.0 - iou + diou_penalty + trade_off * v


def detection_loss(class_outputs, box_outputs, cls_targets, box_targets, num_positives,
                   *, num_classes, anchors_per_location, alpha, gamma, delta,
                   box_loss_weight, label_smoothing, iou_loss_type='none',
                   iou_loss_weight=1.0, anchor_boxes=None, normalizer=None):
    """Total EfficientDet loss over all levels of a batch.

    Args:
      class_outputs: {level: [B, h, w, A*num_classes]} logits, any float dtype.
      box_outputs: {level: [B, h, w, A*4]} codes [ty, tx, th, tw].
      cls_targets: {level: int32 [B, h, w, A]}: class index, -1 negative, -2 ignored.
      box_targets: {level: float32 [B, h, w, A*4]} codes, 0 where not positive.
      num_positives: float [B] positives per image.
      num_classes, anchors_per_location: C and A.
      alpha, gamma, label_smoothing: focal-loss settings.
      delta: Huber switch point.
      box_loss_weight, iou_loss_weight: weights in the total.
      iou_loss_type: one of IOU_LOSS_TYPES; not 'none' needs `anchor_boxes`.
      anchor_boxes: float [num_anchors, 4] [ymin, xmin, ymax, xmax] in level order.
      normalizer: optional float32 scalar used verbatim instead of
        sum(num_positives) + 1, e.g. a cross-replica mean of that sum plus 1.

    Returns:
      dict of float32 scalars: total_loss, cls_loss, box_loss, iou_loss, with
      cls_loss = sum(focal) / normalizer, box_loss = sum(huber) / (4 * normalizer),
      iou_loss = sum over positives of (1 - IoU-family) / (4 * normalizer) as the
      reference, total = cls + box_loss_weight*box + iou_loss_weight*iou.
    """
    if iou_loss_type not in IOU_LOSS_TYPES:
        raise ValueError('iou_loss_type %r is not one of %s' % (iou_loss_type, IOU_LOSS_TYPES))
    if normalizer is None:
        normalizer = tf.reduce_sum(tf.cast(num_positives, tf.float32)) + 1.0
    normalizer = tf.cast(normalizer, tf.float32)
    levels = sorted(cls_targets)
    cls_sum, box_sum = 0.0, 0.0
    for level in levels:
        cls_sum += _class_loss_sum(class_outputs[level], cls_targets[level], num_classes,
                                   anchors_per_location, alpha, gamma, label_smoothing)
        box_sum += huber_box_loss(box_outputs[level], box_targets[level], delta)
    cls_loss = cls_sum / normalizer
    box_loss = box_sum / (normalizer * 4.0)
    if iou_loss_type == 'none':
        box_iou_loss = tf.constant(0.0, tf.float32)
    else:
        if anchor_boxes is None:
            raise ValueError('iou_loss_type=%r needs anchor_boxes to decode the box codes'
                             % iou_loss_type)
        box_iou_loss = _iou_loss_sum(box_outputs, box_targets, cls_targets, anchor_boxes,
                                     levels, iou_loss_type) / (normalizer * 4.0)
    total = cls_loss + box_loss_weight * box_loss + iou_loss_weight * box_iou_loss
    return {'total_loss': total, 'cls_loss': cls_loss, 'box_loss': box_loss,
            'iou_loss': box_iou_loss}


def _class_loss_sum(logits, targets, num_classes, anchors_per_location, alpha, gamma,
                    label_smoothing):
    """Focal loss of one level summed over all non-ignored anchors."""
    logits = tf.convert_to_tensor(logits)
    expected = anchors_per_location * num_classes
    if logits.shape[-1] is not None and logits.shape[-1] != expected:
        raise ValueError('class output has %d channels, expected anchors_per_location * '
                         'num_classes = %d * %d' % (logits.shape[-1], anchors_per_location,
                                                    num_classes))
    targets = tf.cast(targets, tf.int32)
    logits = tf.reshape(logits, tf.concat([tf.shape(targets), [num_classes]], axis=0))
    # one_hot of -1 (negative) and -2 (ignored) is all zeros.
    loss = focal_loss(logits, tf.one_hot(targets, num_classes), alpha, gamma,
                      label_smoothing)
    not_ignored = tf.cast(tf.not_equal(targets, _IGNORED), tf.float32)[..., None]
    return tf.reduce_sum(loss * not_ignored)


def _iou_loss_sum(box_outputs, box_targets, cls_targets, anchor_boxes, levels, iou_type):
    """Sum of the IoU-family loss over positive anchors of the batch."""
    def flat(tensor, depth):  # [B, h, w, A*depth] -> [B, h*w*A, depth]
        tensor = tf.cast(tensor, tf.float32)
        return tf.reshape(tensor, [tf.shape(tensor)[0], -1, depth])

    outputs = tf.concat([flat(box_outputs[l], 4) for l in levels], axis=1)
    targets = tf.concat([flat(box_targets[l], 4) for l in levels], axis=1)
    positive = tf.concat([flat(cls_targets[l], 1) for l in levels], axis=1)[..., 0] >= 0
    # Zero the codes of non-positives *before* decoding: exp() of a wild prediction
    # could overflow, and a NaN in the unselected branch of tf.where still poisons
    # the gradient.
    outputs = tf.where(positive[..., None], outputs, tf.zeros_like(outputs))
    targets = tf.where(positive[..., None], targets, tf.zeros_like(targets))
    anchor_boxes = tf.cast(anchor_boxes, tf.float32)[None]       # [1, num_anchors, 4]
    per_anchor = iou_loss(box_ops.decode_boxes(outputs, anchor_boxes),
                          box_ops.decode_boxes(targets, anchor_boxes), iou_type)
    return tf.reduce_sum(tf.where(positive, per_anchor, tf.zeros_like(per_anchor)))
