"""cleanlab's object-detection scores (ObjectLab, Tkachenko et al. 2023) of every label, every
prediction and every photo; this module only puts the project's data into cleanlab's format
and reads the scores back: the scoring is cleanlab's (cleanlab.object_detection.rank).

cleanlab's format: per photo, labels {'bboxes': (L, 4) [x1, y1, x2, y2] pixels, 'labels': (L,)
class indices}; predictions a list over the classes of (M, 5) [x1, y1, x2, y2, probability].
Class index k is the k-th category by id. Crowd annotations are not labels here.

Scores, each in [0, 1], low = likely wrong (cleanlab's):
  overlooked  per prediction: a confident prediction no label covers (NaN: not a candidate)
  swap        per label: a confident prediction of another class where the label is
  badloc      per label: the label's box against the plausible predictions of its class
  image       per photo: the three pooled as rank.get_label_quality_scores pools them

Covering. cleanlab's overlooked rule takes a confident prediction as a candidate only where no
label overlaps it at all (rank._compute_overlooked_box_scores_for_image: any IoU above 0), so
an object touching a labelled neighbour is never a candidate; in crowded sets most are
(docs/review.md). Here a label covers a prediction from an IoU of COVER_IOU: neighbours touch
below it, while a shifted label (IoU 0.4-0.6 with its object) and a swapped one's own object
stay above it. cleanlab's score of a candidate is unchanged; COVER_IOU = 0 is cleanlab's rule.

Probabilities. cleanlab's thresholds (a prediction is confident above 0.95, plausible above
0.5) assume calibrated class probabilities, as a softmax detector's; EfficientDet's scores are
focal-loss sigmoids, whose sure detections score far lower (without the map cleanlab finds
no issue at all on the planted sets of docs/review.md). The
review puts them on cleanlab's scale first with one monotone map measured on the same
out-of-sample predictions (calibrated_scores): the score above which CONFIDENT_SHARE of the
detections that match a label lie becomes 0.95, the one above which PLAUSIBLE_SHARE lie 0.5
(linear between). The order of the scores is kept; only which predictions pass cleanlab's
thresholds changes.
"""
import contextlib

import numpy as np

from efficientdet_hpu.core.errors import UserError

INSTALL = ('pip install "efficientdet-hpu[review]" (in a checkout: pip install -r '
           'requirements/review.txt)')
CLEANLAB_VERSION = '2.9.0'
# Chosen on the planted errors of the easy set (docs/review.md): 0.9 found more dropped and
# swapped boxes than 0.8 or 0.5, with the same precision or better.
CONFIDENT_SHARE = 0.9
PLAUSIBLE_SHARE = 0.95
MATCH_IOU = 0.5
COVER_IOU = 0.2
KINDS = ('overlooked', 'swap', 'badloc')


class MissingCleanlab(UserError):
    """cleanlab is not installed (or not the version the review was written for)."""


def cleanlab_rank():
    """cleanlab.object_detection.rank, or MissingCleanlab naming the install command."""
    try:
        import cleanlab  # pylint: disable=import-outside-toplevel
        from cleanlab.object_detection import rank  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise MissingCleanlab('the label review needs cleanlab %s (%s): %s'
                              % (CLEANLAB_VERSION, error, INSTALL)) from None
    if not all(hasattr(rank, name) for name in (
            '_get_valid_inputs_for_compute_scores', '_get_overlap_matrix',
            '_get_aggregation_weights')):
        raise MissingCleanlab('cleanlab %s is installed; the label review is written for %s: '
                              '%s' % (cleanlab.__version__, CLEANLAB_VERSION, INSTALL))
    return rank


def classes(coco) -> list:
    """The category ids in cleanlab's class order (by id)."""
    return sorted(category['id'] for category in coco['categories'])


def xyxy(bbox) -> list:
    x, y, w, h = (float(v) for v in bbox)
    return [x, y, x + w, y + h]


def label_boxes(annotations):
    """The annotations cleanlab scores (crowd boxes left out), in their order."""
    return [a for a in annotations if not a.get('iscrowd')]


def to_labels(annotations, class_of, name) -> dict:
    kept = label_boxes(annotations)
    return {'bboxes': np.array([xyxy(a['bbox']) for a in kept], np.float64).reshape(-1, 4),
            'labels': np.array([class_of[a['category_id']] for a in kept], np.int64),
            'image_name': name}


def to_predictions(rows, class_of, probability) -> list:
    """A photo's detection rows as cleanlab's per-class (M, 5) arrays; rows of categories the
    labels do not have are left out."""
    per_class = [[] for _ in class_of]
    for row in rows:
        if row['category_id'] in class_of:
            per_class[class_of[row['category_id']]].append(
                xyxy(row['bbox']) + [float(probability(row['score']))])
    return [np.array(boxes, np.float64).reshape(-1, 5) for boxes in per_class]


def iou_matrix(a, b):
    """IoU [len(a), len(b)] of [x1, y1, x2, y2] boxes."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    left, top = np.maximum(a[:, None, 0], b[None, :, 0]), np.maximum(a[:, None, 1], b[None, :, 1])
    right = np.minimum(a[:, None, 2], b[None, :, 2])
    bottom = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(right - left, 0, None) * np.clip(bottom - top, 0, None)
    area = lambda boxes: (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def matched_scores(photos) -> np.ndarray:
    """Scores of the detections that match a label of their class (IoU >= MATCH_IOU, greedy by
    score, each label once, as COCO matches), over photos [(label dict, rows, class_of)]."""
    found = []
    for labels, rows, class_of in photos:
        rows = sorted((r for r in rows if r['category_id'] in class_of),
                      key=lambda r: -r['score'])
        if not rows or not len(labels['labels']):
            continue
        ious = iou_matrix([xyxy(r['bbox']) for r in rows], labels['bboxes'])
        same = np.array([[class_of[r['category_id']] == k for k in labels['labels']]
                         for r in rows])
        taken = np.zeros(len(labels['labels']), bool)
        for index, row in enumerate(rows):
            candidates = np.where(same[index] & ~taken & (ious[index] >= MATCH_IOU))[0]
            if candidates.size:
                taken[candidates[np.argmax(ious[index][candidates])]] = True
                found.append(row['score'])
    return np.asarray(found, np.float64)


def calibrated_scores(matched):
    """(score -> probability on cleanlab's scale, (score at 0.5, score at 0.95)); the identity
    when no detection matched (nothing to measure)."""
    if matched.size == 0:
        return (lambda score: score), (0.5, 0.95)
    plausible = float(np.quantile(matched, 1.0 - PLAUSIBLE_SHARE))
    confident = max(float(np.quantile(matched, 1.0 - CONFIDENT_SHARE)), plausible + 1e-6)
    points = ([0.0, plausible, confident, 1.0], [0.0, 0.5, 0.95, 1.0])
    return (lambda score: float(np.interp(score, *points))), (plausible, confident)


def _best(similarity, candidates):
    """The index of the candidate prediction most similar to a label, or None."""
    indices = np.where(candidates)[0]
    return None if indices.size == 0 else int(indices[np.argmax(similarity[indices])])


def _label_rows(rank, aux, swap, badloc):
    """Per label: its swap and badloc scores, and the prediction each kind compared it with
    (cleanlab's choice, re-found to name the suggested class and box)."""
    rows = []
    for index, label_class in enumerate(aux['lab_labels']):
        similarity = aux['similarity_matrix'][index]
        other = _best(similarity, (aux['pred_labels'] != label_class)
                      & (aux['pred_label_probs'] > rank.HIGH_PROBABILITY_THRESHOLD))
        same = _best(similarity, (aux['pred_labels'] == label_class)
                     & (aux['pred_label_probs'] > rank.LOW_PROBABILITY_THRESHOLD)
                     & (aux['iou_matrix'][index] > 0))
        rows.append({
            'swap': float(swap[index]), 'badloc': float(badloc[index]),
            'suggested_class': None if other is None else int(aux['pred_labels'][other]),
            'swap_box': None if other is None else aux['pred_bboxes'][other].tolist(),
            'badloc_box': None if same is None else aux['pred_bboxes'][same].tolist()})
    return rows


def _overlooked_rows(aux, overlooked):
    return [{'score': float(value), 'class': int(aux['pred_labels'][index]),
             'box': aux['pred_bboxes'][index].tolist(),
             'probability': float(aux['pred_label_probs'][index])}
            for index, value in enumerate(overlooked) if not np.isnan(value)]


@contextlib.contextmanager
def _covering_from(rank, iou):
    """cleanlab's overlooked rule with a label covering a prediction only from `iou`: the
    overlap matrix that rule alone computes anew (the others read auxiliary_inputs') is cut
    below `iou` while it runs."""
    overlap = rank._get_overlap_matrix  # pylint: disable=protected-access
    if iou > 0:
        def cut(boxes, others):
            matrix = overlap(boxes, others)
            return np.where(matrix >= iou, matrix, 0.0)
        rank._get_overlap_matrix = cut
    try:
        yield
    finally:
        rank._get_overlap_matrix = overlap


def _image_scores(rank, overlooked, swap, badloc) -> np.ndarray:
    """cleanlab's label quality of each photo from its box scores, pooled as
    rank._get_subtype_label_quality_scores pools them: each kind by its softmin, then their
    weighted geometric mean (tests/review: equal to rank.get_label_quality_scores)."""
    weights = rank._get_aggregation_weights(None)  # pylint: disable=protected-access
    total = 0.0
    for kind, boxes in (('overlooked', overlooked), ('swap', swap), ('badloc', badloc)):
        pooled = rank.pool_box_scores_per_image(boxes, temperature=rank.TEMPERATURE)
        total = total + weights[kind] * np.log(rank.TINY_VALUE + pooled)
    return np.exp(total)


def score(labels, predictions, cover_iou=COVER_IOU) -> list:
    """cleanlab's scores of every photo: [{'labels': [{'swap', 'badloc', 'suggested_class',
    'swap_box', 'badloc_box'}] in the order of labels[i], 'overlooked': [{'score', 'class',
    'box', 'probability'}], 'image': score}]; boxes [x1, y1, x2, y2] pixels; a label covers a
    prediction from an IoU of `cover_iou` (0: cleanlab's any overlap)."""
    rank = cleanlab_rank()
    if not labels:
        return []
    # The similarity matrices once for the three box scores (their auxiliary_inputs).
    aux = rank._get_valid_inputs_for_compute_scores(  # pylint: disable=protected-access
        rank.ALPHA, labels, predictions)
    with _covering_from(rank, cover_iou):
        overlooked = rank.compute_overlooked_box_scores(auxiliary_inputs=aux)
    swap = rank.compute_swap_box_scores(auxiliary_inputs=aux)
    badloc = rank.compute_badloc_box_scores(auxiliary_inputs=aux)
    images = _image_scores(rank, overlooked, swap, badloc)
    return [{'labels': _label_rows(rank, aux[i], swap[i], badloc[i]),
             'overlooked': _overlooked_rows(aux[i], overlooked[i]), 'image': float(images[i])}
            for i in range(len(labels))]
