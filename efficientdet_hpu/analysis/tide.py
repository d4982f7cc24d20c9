"""TIDE error analysis of box detections (Bolya et al., "TIDE: A General Toolbox for Identifying
Object Detection Errors", ECCV 2020), in NumPy with pycocotools' IoU.

Each image is matched as TIDE does: detections sorted by score (at most `max_dets`), each takes
the same-class ground truth of highest IoU not yet taken if that IoU >= t_f (0.5); a leftover
detection over a crowd box of its class (crowd IoU > t_f) is ignored. Every other detection is
a false positive of the first type that fits, in this order:
  background      the image has no ground truth
  localisation    best same-class IoU in [t_b, t_f]
  classification  IoU >= t_f with a ground truth of another class
  duplicate       IoU >= t_f with a same-class ground truth already taken
  background      IoU <= t_b with every ground truth
  both            anything else (wrong class and t_b < IoU < t_f)
and a ground truth no detection took, and no classification or localisation error points at,
is missed. AP is TIDE's: AP50 per class over 101 recall points, averaged over the classes that
have ground truth or detections (a class with detections only scores 0).

dAP of a type = AP after fixing every error of that type - AP (negative clamped to 0):
classification and localisation errors become true positives (of the ground truth's class) for
the highest-scoring such detection per ground truth, the others are dropped; duplicate,
background and both detections are dropped; a missed ground truth is removed from the count.
Two special ones: false positives (every false positive scored below every true positive) and
false negatives (every unmatched ground truth removed from the count).

Boxes are COCO [x, y, width, height] in image pixels.
"""
import collections
import dataclasses
from typing import Dict, List

import numpy as np
from pycocotools import mask as mask_utils

ERROR_TYPES = ('classification', 'localisation', 'both', 'duplicate', 'background', 'missed')
SPECIAL_TYPES = ('false_positives', 'false_negatives')
SHORT_NAMES = {'classification': 'Cls', 'localisation': 'Loc', 'both': 'Both',
               'duplicate': 'Dupe', 'background': 'Bkg', 'missed': 'Miss',
               'false_positives': 'FalsePos', 'false_negatives': 'FalseNeg'}
FOREGROUND_IOU = 0.5  # t_f
BACKGROUND_IOU = 0.1  # t_b
MAX_DETS = 100
_RECALL_POINTS = np.arange(101) / 100.0  # x / 100 exactly, as TIDE and COCOeval round them.


@dataclasses.dataclass
class ImageTruth:
    """One image's ground truth: boxes float64 [G, 4] xywh, classes int64 [G], crowd bool [G]."""
    boxes: np.ndarray
    classes: np.ndarray
    crowd: np.ndarray


@dataclasses.dataclass
class ImageDetections:
    """One image's detections: boxes float64 [D, 4] xywh, classes int64 [D], scores [D]."""
    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray


@dataclasses.dataclass
class Error:
    """One error. kind: an ERROR_TYPES name. cls: the detection's (or missed box's) class.
    point: the detection's original (score, False) in the AP data, None when it was ignored
    or for a missed box. truth: (image index, ground-truth index) a classification or
    localisation error points at while that ground truth is untaken, else None."""
    kind: str
    cls: int
    uid: int
    score: float
    point: object
    truth: object = None
    truth_class: int = -1


@dataclasses.dataclass
class ImageOutcome:
    """Per image: det_kind [D'] str ('tp', 'ignored' or an error type) of the kept detections
    (sorted by score), det_order [D'] their indices in the input, truth_kind [G] ('tp',
    'crowd', 'missed' or 'fixable': unmatched but pointed at by a Cls/Loc error), det_truth
    [D'] the input index of the truth a true positive took (-1 otherwise)."""
    det_kind: List[str]
    det_order: np.ndarray
    truth_kind: List[str]
    det_truth: np.ndarray


@dataclasses.dataclass
class Analysis:
    """The outcome of `analyse`. ap: TIDE's mAP50 (0..1); class_ap: {class: AP50};
    delta: {type: dAP} for ERROR_TYPES and SPECIAL_TYPES; class_delta: {class: {type: dAP}};
    counts: {type: number of errors}; class_counts: {class: {type: count}}; images: per-image
    ImageOutcome in input order."""
    ap: float
    class_ap: Dict[int, float]
    delta: Dict[str, float]
    class_delta: Dict[int, Dict[str, float]]
    counts: Dict[str, int]
    class_counts: Dict[int, Dict[str, int]]
    images: List[ImageOutcome]


def tide_ap(points, num_truth):
    """TIDE's AP (0..1) of one class. points: [(score, is_true)] in insertion order (a stable
    sort by descending score breaks ties by it); num_truth: ground-truth count."""
    if num_truth <= 0:
        return 0.0
    ordered = sorted(points, key=lambda point: -point[0])
    is_true = np.array([bool(point[1]) for point in ordered], bool)
    true_positives = np.cumsum(is_true)
    precision = true_positives / np.arange(1, len(is_true) + 1)
    recall = true_positives / float(num_truth)
    precision = np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision
    indices = np.searchsorted(recall, _RECALL_POINTS, side='left')
    values = np.where(indices < len(precision), precision[np.minimum(indices, len(precision) - 1)]
                      if len(precision) else 0.0, 0.0)
    return float(np.mean(values))


def iou_matrix(detections, truth_boxes, crowd):
    """float64 [D, G] IoU of xywh boxes [D, 4] and [G, 4]; crowd [G] columns take
    intersection / detection area. pycocotools' formula."""
    if not len(detections) or not len(truth_boxes):
        return np.zeros((len(detections), len(truth_boxes)))
    return np.asarray(mask_utils.iou(detections.tolist(), truth_boxes.tolist(),
                                     [int(c) for c in crowd]), np.float64).reshape(
        len(detections), len(truth_boxes))


def _match(det_classes, iou, truth_classes, pos):
    """Greedy TIDE matching; returns (matched truth [D] int, -1 for none; truth_used [G])."""
    same = det_classes[:, None] == truth_classes[None, :]
    buffer = iou * same
    matched = np.full(len(det_classes), -1, np.int64)
    truth_used = np.zeros(len(truth_classes), bool)
    for index in range(len(det_classes)):
        if not buffer.shape[1]:
            break
        best = int(np.argmax(buffer[index]))
        if buffer[index, best] >= pos:
            matched[index], truth_used[best] = best, True
            buffer[:, best] = 0.0
    return matched, truth_used


def _classify(index, iou, same, truth_used, has_truth, pos, bg):
    """(error type, ground-truth index or -1) of false positive `index`."""
    if not has_truth:
        return 'background', -1
    row, same_row = iou[index], iou[index] * same[index]
    best = int(np.argmax(same_row))
    if bg <= same_row[best] <= pos:
        return 'localisation', best
    other = row * ~same[index]
    best = int(np.argmax(other))
    if other[best] >= pos:
        return 'classification', best
    taken = same_row * truth_used
    best = int(np.argmax(taken))
    if taken[best] >= pos:
        return 'duplicate', best
    if row.max() <= bg:
        return 'background', -1
    return 'both', -1


class _Collector:
    """The AP data and error list over all images, in TIDE's insertion order."""

    def __init__(self):
        self.points = collections.defaultdict(dict)   # class -> {uid: (score, is_true)}
        self.num_truth = collections.defaultdict(int)
        self.false_negatives = collections.defaultdict(int)
        self.errors: List[Error] = []
        self.best = {}  # (image, truth) -> (score, uid) of its best Cls/Loc error.
        self.uid = 0

    def next_uid(self):
        self.uid += 1
        return self.uid


def _image(collector, image_index, truth, dets, pos, bg, max_dets):
    """Matches one image, adding its AP points and errors; returns its ImageOutcome."""
    keep = ~truth.crowd
    truth_boxes, truth_classes = truth.boxes[keep], truth.classes[keep]
    truth_index = np.flatnonzero(keep)
    for cls in truth_classes.tolist():
        collector.num_truth[cls] += 1
    order = np.argsort(-dets.scores, kind='stable')[:max_dets]
    boxes, classes, scores = dets.boxes[order], dets.classes[order], dets.scores[order]
    iou = iou_matrix(boxes, truth_boxes, np.zeros(len(truth_boxes)))
    matched, truth_used = _match(classes, iou, truth_classes, pos)
    used = matched >= 0
    crowd_iou = iou_matrix(boxes, truth.boxes[truth.crowd], np.ones(int(truth.crowd.sum())))
    crowd_same = classes[:, None] == truth.classes[truth.crowd][None, :]
    ignored = ~used & np.any((crowd_iou > pos) & crowd_same, axis=1)
    same = classes[:, None] == truth_classes[None, :]
    det_kind, fixable = [], set()
    for index in range(len(order)):
        uid, cls, score = collector.next_uid(), int(classes[index]), float(scores[index])
        if not ignored[index]:
            collector.points[cls][uid] = (score, bool(used[index]))
        if used[index]:
            det_kind.append('tp')
            continue
        kind, target = _classify(index, iou, same, truth_used, len(truth_boxes) > 0, pos, bg)
        error = Error(kind, cls, uid, score, None if ignored[index] else (score, False))
        if kind in ('classification', 'localisation') and not truth_used[target]:
            error.truth, error.truth_class = (image_index, target), int(truth_classes[target])
            fixable.add(target)
            if collector.best.get(error.truth, (-1.0, 0))[0] < score:
                collector.best[error.truth] = (score, uid)
        collector.errors.append(error)
        det_kind.append('ignored' if ignored[index] else kind)
    truth_kind = ['crowd'] * len(truth.boxes)
    for local, original in enumerate(truth_index.tolist()):
        truth_kind[original] = 'tp' if truth_used[local] else (
            'fixable' if local in fixable else 'missed')
        if not truth_used[local]:
            collector.false_negatives[int(truth_classes[local])] += 1
            if local not in fixable:
                collector.errors.append(Error('missed', int(truth_classes[local]),
                                              collector.next_uid(), 0.0, None))
    det_truth = np.where(used, truth_index[np.maximum(matched, 0)] if len(truth_index) else -1,
                         -1)
    return ImageOutcome(det_kind, order, truth_kind, det_truth)


def _fixed_data(collector, kinds):
    """(points per class, truth count per class) with every error of `kinds` fixed."""
    num_truth = dict(collector.num_truth)
    for cls in collector.points:
        num_truth.setdefault(cls, 0)
    points = collections.defaultdict(list)
    for error in collector.errors:
        if error.kind not in kinds:
            if error.point is not None:
                points[error.cls].append(error.point)
        elif error.kind == 'missed':
            num_truth[error.cls] -= 1
        elif error.truth is not None and collector.best[error.truth][1] == error.uid:
            points[error.truth_class].append((error.score, True))
    for cls in num_truth:
        points[cls].extend(point for point in collector.points.get(cls, {}).values()
                           if point[1])
    return points, num_truth


def _original_data(collector):
    """(points per class in insertion order, truth count per class), nothing fixed."""
    num_truth = dict(collector.num_truth)
    for cls in collector.points:
        num_truth.setdefault(cls, 0)
    return {cls: list(values.values()) for cls, values in collector.points.items()}, num_truth


def _class_aps(points, num_truth):
    """{class: AP} over the classes TIDE averages (truth or detections present)."""
    return {cls: tide_ap(points.get(cls, []), count) for cls, count in num_truth.items()
            if count > 0 or points.get(cls)}


def _mean(class_aps):
    return float(np.mean(list(class_aps.values()))) if class_aps else 0.0


def _special(collector, kind):
    """Points and counts of the two special fixes (false positives / false negatives)."""
    points, num_truth = _fixed_data(collector, ())  # TIDE fixes in this order too.
    if kind == 'false_positives':
        points = {cls: [(1.0 if is_true else 0.0, is_true) for _, is_true in values]
                  for cls, values in points.items()}
    else:
        num_truth = {cls: count - collector.false_negatives.get(cls, 0)
                     for cls, count in num_truth.items()}
    return points, num_truth


def _deltas(collector, class_ap):
    """({type: dAP}, {class: {type: dAP}}), each clamped at 0 as TIDE does."""
    ap = _mean(class_ap)
    delta, class_delta = {}, collections.defaultdict(dict)
    for kind in ERROR_TYPES + SPECIAL_TYPES:
        data = (_fixed_data(collector, (kind,)) if kind in ERROR_TYPES
                else _special(collector, kind))
        fixed = _class_aps(*data)
        delta[kind] = max(_mean(fixed) - ap, 0.0)
        for cls, value in class_ap.items():
            class_delta[cls][kind] = max(fixed.get(cls, value) - value, 0.0)
    return delta, dict(class_delta)


def analyse(truths, detections, pos=FOREGROUND_IOU, bg=BACKGROUND_IOU, max_dets=MAX_DETS):
    """TIDE over images.

    Args:
      truths: [ImageTruth] per image.
      detections: [ImageDetections] per image, aligned with `truths`.
      pos, bg: the foreground and background IoU thresholds t_f, t_b.
      max_dets: detections kept per image (highest scores).
    Returns:
      Analysis.
    """
    if len(truths) != len(detections):
        raise ValueError(f'{len(truths)} ground-truth images but {len(detections)} '
                         'detection images')
    collector = _Collector()
    images = [_image(collector, index, truth, dets, pos, bg, max_dets)
              for index, (truth, dets) in enumerate(zip(truths, detections))]
    class_ap = _class_aps(*_original_data(collector))
    delta, class_delta = _deltas(collector, class_ap)
    counts = {kind: 0 for kind in ERROR_TYPES}
    class_counts = collections.defaultdict(lambda: {kind: 0 for kind in ERROR_TYPES})
    for error in collector.errors:
        counts[error.kind] += 1
        class_counts[error.cls][error.kind] += 1
    return Analysis(_mean(class_ap), class_ap, delta, class_delta, counts,
                    {cls: class_counts[cls] for cls in sorted(class_ap)}, images)
