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
is missed. AP is AP50 per class over 101 recall points (TIDE's), averaged over the classes that
have ground truth: a class without ground truth has no AP, as in COCOeval (-1, left out of the
mean), where TIDE's own code scores a class with detections only 0; such classes are listed in
`unscored` (their detections still count as errors).

dAP of a type = AP after fixing every error of that type - AP (negative clamped to 0):
classification and localisation errors become true positives (of the ground truth's class) for
the highest-scoring such detection per ground truth, the others are dropped; duplicate,
background and both detections are dropped; a missed ground truth is removed from the count.
Two special ones: false positives (every false positive scored below every true positive) and
false negatives (every unmatched ground truth removed from the count).

Boxes are COCO [x, y, width, height] in image pixels.
"""
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
    ImageOutcome in input order; unscored: the classes detected but without ground truth
    (no AP: left out of ap, class_ap and delta)."""
    ap: float
    class_ap: Dict[int, float]
    delta: Dict[str, float]
    class_delta: Dict[int, Dict[str, float]]
    counts: Dict[str, int]
    class_counts: Dict[int, Dict[str, int]]
    images: List[ImageOutcome]
    unscored: List[int] = dataclasses.field(default_factory=list)


def tide_ap(points, num_truth):
    """TIDE's AP (0..1) of one class. points: [(score, is_true)] in insertion order (a stable
    sort by descending score breaks ties by it); num_truth: ground-truth count."""
    if num_truth <= 0 or not len(points):
        return 0.0
    values = np.asarray(points, np.float64).reshape(-1, 2)
    is_true = values[np.argsort(-values[:, 0], kind='stable'), 1] > 0
    true_positives = np.cumsum(is_true)
    precision = true_positives / np.arange(1, len(is_true) + 1)
    recall = true_positives / float(num_truth)
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    indices = np.searchsorted(recall, _RECALL_POINTS, side='left')
    read = np.where(indices < len(precision), precision[np.minimum(indices, len(precision) - 1)],
                    0.0)
    return float(np.mean(read))


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
    if not buffer.shape[1]:
        return matched, truth_used
    # Only a detection with some same-class IoU >= pos can match; taking a truth only lowers
    # the others' rows, so skipping the rest changes nothing.
    for index in np.flatnonzero(np.any(buffer >= pos, axis=1)).tolist():
        best = int(np.argmax(buffer[index]))
        if buffer[index, best] >= pos:
            matched[index], truth_used[best] = best, True
            buffer[:, best] = 0.0
    return matched, truth_used


def _classify(false, iou, same, truth_used, pos, bg):
    """(error type [F] str, ground-truth index [F] or -1) of the false positives `false`
    (indices of rows of iou [D, G]), TIDE's tests in TIDE's order."""
    kinds = np.full(len(false), 'background', object)
    targets = np.full(len(false), -1, np.int64)
    if not iou.shape[1] or not len(false):
        return kinds, targets
    rows = np.arange(len(false))
    overlap, same = iou[false], same[false]
    same_iou = overlap * same
    best_same = np.argmax(same_iou, axis=1)
    local = (same_iou[rows, best_same] >= bg) & (same_iou[rows, best_same] <= pos)
    other = overlap * ~same
    best_other = np.argmax(other, axis=1)
    wrong_class = ~local & (other[rows, best_other] >= pos)
    taken = same_iou * truth_used[None, :]
    best_taken = np.argmax(taken, axis=1)
    duplicate = ~local & ~wrong_class & (taken[rows, best_taken] >= pos)
    rest = ~local & ~wrong_class & ~duplicate
    kinds[rest & (overlap.max(axis=1) > bg)] = 'both'
    kinds[duplicate], targets[duplicate] = 'duplicate', best_taken[duplicate]
    kinds[wrong_class], targets[wrong_class] = 'classification', best_other[wrong_class]
    kinds[local], targets[local] = 'localisation', best_same[local]
    return kinds, targets


_KINDS = ('tp', 'ignored') + ERROR_TYPES  # Codes of det_kind: index in this tuple.


@dataclasses.dataclass
class _Columns:
    """Every kept detection of every image in TIDE's order (images in order, each by score):
    cls, score, kind (index in _KINDS; 'ignored' rows are false positives over a crowd box,
    their error type in error_kind), truth_key (a global truth id a Cls/Loc error points at
    while that truth is untaken, else -1), truth_class (that truth's class)."""
    cls: np.ndarray
    score: np.ndarray
    kind: np.ndarray
    error_kind: np.ndarray
    truth_key: np.ndarray
    truth_class: np.ndarray


def _image(image_truth, dets, pos, bg, max_dets, first_key):
    """Matches one image. Returns (ImageOutcome, column parts [6 arrays], truth classes of
    the non-crowd truths [G'], their outcome codes [G']: 0 tp, 1 fixable, 2 missed)."""
    keep = ~image_truth.crowd
    truth_boxes, truth_classes = image_truth.boxes[keep], image_truth.classes[keep]
    truth_index = np.flatnonzero(keep)
    order = np.argsort(-dets.scores, kind='stable')[:max_dets]
    boxes, classes, scores = dets.boxes[order], dets.classes[order], dets.scores[order]
    iou = iou_matrix(boxes, truth_boxes, np.zeros(len(truth_boxes)))
    matched, truth_used = _match(classes, iou, truth_classes, pos)
    used = matched >= 0
    crowd_iou = iou_matrix(boxes, image_truth.boxes[image_truth.crowd],
                           np.ones(int(image_truth.crowd.sum())))
    crowd_same = classes[:, None] == image_truth.classes[image_truth.crowd][None, :]
    ignored = ~used & np.any((crowd_iou > pos) & crowd_same, axis=1)
    false = np.flatnonzero(~used)
    false_kind, false_target = _classify(false, iou, classes[:, None] == truth_classes[None, :],
                                         truth_used, pos, bg)
    error_kind = np.zeros(len(order), np.int64)
    error_kind[false] = [_KINDS.index(kind) for kind in false_kind.tolist()]
    kind = np.where(used, 0, np.where(ignored, 1, error_kind))
    fixable = (np.isin(error_kind, [_KINDS.index('classification'),
                                    _KINDS.index('localisation')]) & ~used)
    target = np.zeros(len(order), np.int64)
    target[false] = false_target
    fixable &= (target >= 0) & ~truth_used[np.maximum(target, 0)] if len(truth_used) else False
    truth_key = np.where(fixable, first_key + target, -1)
    truth_class = np.where(fixable, truth_classes[np.maximum(target, 0)]
                           if len(truth_classes) else -1, -1)
    truth_code = np.where(truth_used, 0, 2)
    truth_code[np.unique(target[fixable])] = 1
    truth_kind = ['crowd'] * len(image_truth.boxes)
    for local, original in enumerate(truth_index.tolist()):
        truth_kind[original] = ('tp', 'fixable', 'missed')[truth_code[local]]
    det_truth = np.where(used, truth_index[np.maximum(matched, 0)] if len(truth_index) else -1,
                         -1)
    outcome = ImageOutcome([_KINDS[k] for k in kind.tolist()], order, truth_kind, det_truth)
    return outcome, (classes, scores, kind, error_kind, truth_key, truth_class), \
        truth_classes, truth_code


def _best_per_truth(columns):
    """bool [N]: the highest-scoring fixable error of each truth (the first one on ties),
    the one TIDE fixes; the others pointing at that truth are dropped."""
    rows = np.flatnonzero(columns.truth_key >= 0)
    best = np.zeros(len(columns.cls), bool)
    if len(rows):
        ranked = rows[np.lexsort((rows, -columns.score[rows], columns.truth_key[rows]))]
        first = np.r_[True, columns.truth_key[ranked[1:]] != columns.truth_key[ranked[:-1]]]
        best[ranked[first]] = True
    return best


def _points(columns, fixed, best):
    """(class [P], score [P], is_true [P]) in TIDE's fix order: the errors' points first
    (original, fixed or dropped), then the true positives."""
    error = columns.kind != 0
    fix = error & np.isin(columns.error_kind, [_KINDS.index(kind) for kind in fixed])
    becomes_true = fix & best
    stays_false = error & ~fix & (columns.kind != 1)
    error_rows = np.flatnonzero(becomes_true | stays_false)
    true_rows = np.flatnonzero(~error)
    cls = np.r_[np.where(becomes_true, columns.truth_class, columns.cls)[error_rows],
                columns.cls[true_rows]]
    return (cls, np.r_[columns.score[error_rows], columns.score[true_rows]],
            np.r_[becomes_true[error_rows], np.ones(len(true_rows), bool)])


def _class_aps(points, num_truth, classes):
    """{class: AP} over `classes` (those with ground truth) that have truth or points
    (after a fix removed a class's truths, TIDE scores it 0 if it has points)."""
    cls, score, is_true = points
    order = np.argsort(cls, kind='stable')
    starts = np.searchsorted(cls[order], classes, side='left')
    ends = np.searchsorted(cls[order], classes, side='right')
    aps = {}
    for value, start, end in zip(classes, starts.tolist(), ends.tolist()):
        rows = order[start:end]
        if num_truth.get(value, 0) > 0 or len(rows):
            aps[value] = tide_ap(np.c_[score[rows], is_true[rows]], num_truth.get(value, 0))
    return aps


def _mean(class_aps):
    return float(np.mean(list(class_aps.values()))) if class_aps else 0.0


def _variant(columns, best, num_truth, missed, false_negatives, kind):
    """(points, truth counts) with one error type (or a special one) fixed."""
    if kind in ERROR_TYPES:
        counts = ({cls: count - missed.get(cls, 0) for cls, count in num_truth.items()}
                  if kind == 'missed' else num_truth)
        return _points(columns, (kind,), best), counts
    cls, score, is_true = _points(columns, (), best)
    if kind == 'false_positives':
        return (cls, is_true.astype(np.float64), is_true), num_truth
    return (cls, score, is_true), {cls_: count - false_negatives.get(cls_, 0)
                                   for cls_, count in num_truth.items()}


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
    images, parts, truth_classes, truth_codes, first_key = [], [], [], [], 0
    for truth, dets in zip(truths, detections):
        outcome, part, classes, codes = _image(truth, dets, pos, bg, max_dets, first_key)
        first_key += int((~truth.crowd).sum())
        images.append(outcome)
        parts.append(part)
        truth_classes.append(classes)
        truth_codes.append(codes)
    columns = _Columns(*(np.concatenate([part[i] for part in parts] + [np.zeros(0, dtype)])
                         for i, dtype in enumerate((np.int64, np.float64, np.int64, np.int64,
                                                    np.int64, np.int64))))
    truth_classes = np.concatenate(truth_classes + [np.zeros(0, np.int64)])
    truth_codes = np.concatenate(truth_codes + [np.zeros(0, np.int64)])
    return _summarise(columns, truth_classes, truth_codes, images)


def _per_class_counts(values):
    unique, counts = np.unique(values, return_counts=True)
    return dict(zip(unique.tolist(), counts.tolist()))


def _summarise(columns, truth_classes, truth_codes, images):
    """The Analysis of all images' columns and truths."""
    num_truth = _per_class_counts(truth_classes)
    missed = _per_class_counts(truth_classes[truth_codes == 2])
    false_negatives = _per_class_counts(truth_classes[truth_codes != 0])
    in_ap = columns.kind != 1
    classes = sorted(num_truth)
    unscored = sorted(set(columns.cls[in_ap].tolist()) - set(classes))
    class_ap = _class_aps((columns.cls[in_ap], columns.score[in_ap], columns.kind[in_ap] == 0),
                          num_truth, classes)
    ap = _mean(class_ap)
    best = _best_per_truth(columns)
    delta, class_delta = {}, {cls: {} for cls in class_ap}
    for kind in ERROR_TYPES + SPECIAL_TYPES:
        fixed = _class_aps(*_variant(columns, best, num_truth, missed, false_negatives, kind),
                           classes)
        delta[kind] = max(_mean(fixed) - ap, 0.0)  # TIDE clamps negative ones (binning).
        for cls, value in class_ap.items():
            class_delta[cls][kind] = max(fixed.get(cls, value) - value, 0.0)
    error_rows = columns.kind != 0
    missed_classes = truth_classes[truth_codes == 2]
    kinds = np.r_[columns.error_kind[error_rows],
                  np.full(len(missed_classes), _KINDS.index('missed'))]
    owners = np.r_[columns.cls[error_rows], missed_classes]
    counts = {kind: int(np.sum(kinds == _KINDS.index(kind))) for kind in ERROR_TYPES}
    class_counts = {cls: {kind: int(np.sum((kinds == _KINDS.index(kind)) & (owners == cls)))
                          for kind in ERROR_TYPES} for cls in sorted(class_ap)}
    return Analysis(ap, class_ap, delta, class_delta, counts, class_counts, images, unscored)
