"""Detection post-processing in NumPy on the host: decode + NMS.

The host-side counterpart of postprocess.generate_detections, with the same choices: top-k
over (anchor, class) pairs or each anchor's best class (max_nms_inputs=0); hard NMS (a box
suppressed when its IoU with a kept box exceeds iou_thresh) or Gaussian soft-NMS; per class,
or one class-agnostic NMS with boxes clipped to the network input (google/automl's serving
path); scores strictly above score_thresh. `bench.py infer --postprocess=host` measures what
post-processing costs outside the graph. Pure functions over arrays: no flags, no config.
"""
import numpy as np


def sigmoid(logits):
    return 1.0 / (1.0 + np.exp(-logits))


def decode_boxes(codes, anchor_boxes):
    """Faster R-CNN codes [..., 4] [ty, tx, th, tw] + anchors [..., 4] -> [ymin, xmin, ymax,
    xmax] in the anchors' frame (box_ops.decode_boxes in NumPy)."""
    anchor_h = anchor_boxes[..., 2] - anchor_boxes[..., 0] + 1e-8
    anchor_w = anchor_boxes[..., 3] - anchor_boxes[..., 1] + 1e-8
    centre_y = codes[..., 0] * anchor_h + (anchor_boxes[..., 0] + anchor_boxes[..., 2]) / 2.0
    centre_x = codes[..., 1] * anchor_w + (anchor_boxes[..., 1] + anchor_boxes[..., 3]) / 2.0
    half_h = np.exp(codes[..., 2]) * anchor_h / 2.0
    half_w = np.exp(codes[..., 3]) * anchor_w / 2.0
    return np.stack([centre_y - half_h, centre_x - half_w, centre_y + half_h,
                     centre_x + half_w], axis=-1)


def iou_many_to_many(boxes_a, boxes_b):
    """IoU of boxes [A, 4] with boxes [B, 4] -> [A, B] (0 where the union is empty);
    [ymin, xmin, ymax, xmax]."""
    a, b = boxes_a[:, None, :], boxes_b[None, :, :]
    inter_h = np.maximum(0.0, np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]))
    inter_w = np.maximum(0.0, np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]))
    intersection = inter_h * inter_w
    union = ((a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
             + (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1]) - intersection)
    return np.divide(intersection, union, out=np.zeros_like(intersection), where=union > 0)


def iou_one_to_many(box, boxes):
    """IoU of box [4] with boxes [K, 4] -> [K] (0 where the union is empty)."""
    return iou_many_to_many(np.asarray(box)[None], np.asarray(boxes).reshape(-1, 4))[0]


def nms(boxes, scores, iou_thresh, max_output_size, classes=None):
    """Greedy hard NMS, per class when `classes` is given (a box only suppresses boxes of
    its own class). boxes [K, 4], scores [K], classes int [K] -> kept indices, best first.

    Greedy in one global score order is the same as NMS per class followed by keeping the
    best max_output_size overall, and stops after max_output_size boxes.
    """
    order = np.argsort(-scores, kind='stable')
    kept = []
    while order.size and len(kept) < max_output_size:
        best, rest = order[0], order[1:]
        kept.append(best)
        suppressed = iou_one_to_many(boxes[best], boxes[rest]) > iou_thresh
        if classes is not None:
            suppressed &= classes[rest] == classes[best]
        order = rest[~suppressed]
    return np.asarray(kept, np.int64)


def soft_nms(boxes, scores, sigma, score_thresh, max_output_size, classes=None):
    """Greedy Gaussian soft-NMS (Bodla et al. 2017) as TensorFlow's NonMaxSuppressionV5 runs
    it: keep the highest current score (the lower index on ties), multiply each remaining
    score by exp(-iou**2 / sigma) with the kept box (only boxes of its class when `classes`
    is given), drop scores <= score_thresh, repeat. boxes [K, 4], scores [K] ->
    (kept indices int64 [M], their decayed scores float64 [M]), best first."""
    current = scores.astype(np.float64)
    alive = np.flatnonzero(current > score_thresh)
    kept, kept_scores = [], []
    while alive.size and len(kept) < max_output_size:
        position = int(np.argmax(current[alive]))
        best, rest = alive[position], np.delete(alive, position)
        kept.append(best)
        kept_scores.append(current[best])
        decay = np.exp(-iou_one_to_many(boxes[best], boxes[rest]) ** 2 / sigma)
        if classes is not None:
            decay = np.where(classes[rest] == classes[best], decay, 1.0)
        current[rest] *= decay
        alive = rest[current[rest] > score_thresh]
    return np.asarray(kept, np.int64), np.asarray(kept_scores, np.float64)


def _top(values, k):
    """Indices of the k largest of a 1-D array (all of them when k is 0 or >= its size)."""
    if not k or values.size <= k:
        return np.arange(values.size)
    return np.argpartition(-values, k - 1)[:k]


def top_pairs(logits, k):
    """Flat indices (anchor * C + class) of the k best (anchor, class) pairs of logits [N, C],
    via the k best anchors by max logit (as postprocess._candidates; the same pairs up to
    ties), instead of a partition of all N * C."""
    anchors = _top(logits.max(axis=1), k)
    pairs = (anchors[:, None] * logits.shape[1] + np.arange(logits.shape[1])).reshape(-1)
    return pairs[_top(logits[anchors].reshape(-1), k)]


def candidates(logits, k):
    """(anchor index, class index) int64 [K] of the NMS candidates of logits [N, C]: the k
    best (anchor, class) pairs, or with k = 0 every anchor with its best class (automl)."""
    if not k:
        return np.arange(logits.shape[0]), np.argmax(logits, axis=1)
    pairs = top_pairs(logits, k)
    return pairs // logits.shape[1], pairs % logits.shape[1]


def detect_one_image(logits, codes, anchor_boxes, *, iou_thresh, score_thresh,
                     max_nms_inputs, max_output_size, method='hard', sigma=0.5,
                     class_agnostic=False):
    """One image's detections in network-input pixels.

    Args:
      logits: float [N, C] class logits; codes: float [N, 4]; anchor_boxes: float [N, 4].
      method: 'hard' or 'gaussian' (soft-NMS with `sigma`); class_agnostic: one NMS over
        all classes instead of one per class.
    Returns:
      boxes float32 [M, 4] [ymin, xmin, ymax, xmax], scores float32 [M] (descending),
      labels int32 [M] (class index + 1), M <= max_output_size.
    """
    anchor_index, class_index = candidates(logits, max_nms_inputs)
    scores = sigmoid(logits[anchor_index, class_index].astype(np.float64))
    keep = scores > score_thresh
    anchor_index, class_index, scores = anchor_index[keep], class_index[keep], scores[keep]
    boxes = decode_boxes(codes[anchor_index].astype(np.float64), anchor_boxes[anchor_index])
    per_class = None if class_agnostic else class_index
    if method == 'gaussian':
        kept, scores = soft_nms(boxes, scores, sigma, score_thresh, max_output_size, per_class)
    else:
        kept = nms(boxes, scores, iou_thresh, max_output_size, classes=per_class)
        scores = scores[kept]
    return (boxes[kept].astype(np.float32), scores.astype(np.float32),
            (class_index[kept] + 1).astype(np.int32))


def generate_detections(logits, codes, anchor_boxes, image_scales, image_sizes,
                        clip_to_image=True, network_size=None, **nms_args):
    """Batch version: logits [B, N, C], codes [B, N, 4], anchor_boxes [N, 4], image_scales
    [B], image_sizes [B, 2] (height, width). Returns a list of B (boxes, scores, labels) with
    boxes scaled to original pixels, as postprocess does: with class_agnostic clipped to the
    network input (network_size (height, width); by default twice the anchors' mean centre,
    as each level's centres lie symmetric about the middle) before scaling, with
    clip_to_image clipped to the image after, the boxes left without area dropped."""
    if nms_args.get('class_agnostic') and network_size is None:
        twice_centre = (anchor_boxes[:, :2] + anchor_boxes[:, 2:]).mean(axis=0)
        network_size = np.round(twice_centre).tolist()
    results = []
    for index in range(logits.shape[0]):
        boxes, scores, labels = detect_one_image(logits[index], codes[index], anchor_boxes,
                                                 **nms_args)
        if nms_args.get('class_agnostic'):
            boxes = np.clip(boxes, 0.0, list(network_size) * 2)
        boxes = boxes * np.float32(image_scales[index])
        if clip_to_image:
            height, width = (float(v) for v in image_sizes[index])
            boxes = np.clip(boxes, 0.0, [height, width, height, width])
            kept = has_area(boxes)
            boxes, scores, labels = boxes[kept], scores[kept], labels[kept]
        results.append((boxes.astype(np.float32), scores, labels))
    return results


def has_area(boxes):
    """[M] bool: the boxes [M, 4] [ymin, xmin, ymax, xmax] with an area. Clipped to the photo,
    a box that lay wholly outside it (in the padding of the network input) has none, and is
    not a detection (postprocess.generate_detections drops it too)."""
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
