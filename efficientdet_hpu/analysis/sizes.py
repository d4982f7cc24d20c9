"""AP50 and recall by object size in network-input pixels, next to the anchor coverage of each
size bin (the data doctor's measure: the share of boxes whose best anchor reaches the recipe's
match_threshold).

Sizes are sqrt(width * height) after the eval resize (data/anchor_coverage.py's geometry,
scale multiplier 1). Per bin: recall is the share of its truths TIDE matched at IoU 0.5;
missed is the share no detection came near (TIDE's missed type); AP50 is TIDE's AP over the
bin's truths, the true positives that took them, and the false positives whose own size falls
in the bin (COCO's area-range rule).
"""
import numpy as np

from efficientdet_hpu.analysis import tide
from efficientdet_hpu.data import anchor_coverage
from efficientdet_hpu.data import annotated_boxes

SIZE_EDGES = (0.0, 16.0, 32.0, 64.0, 128.0, float('inf'))


def bin_names(edges=SIZE_EDGES):
    return ['>= %d px' % low if high == float('inf') else '%d-%d px' % (low, high)
            for low, high in zip(edges[:-1], edges[1:])]


def _bin(sizes, edges):
    return np.clip(np.searchsorted(edges, sizes, side='right') - 1, 0, len(edges) - 2)


def network_scales(image_sizes, setup):
    """float64 [M]: network pixels per original pixel of each (height, width) at the eval
    resize (sqrt of the two axes' scales)."""
    _, crop, resized = anchor_coverage.fit_windows(image_sizes, setup.output_size, [1.0])
    ratio = resized[:, 0].astype(np.float64) / np.maximum(crop[:, 0], 1)
    return np.sqrt(ratio[:, 0] * ratio[:, 1])


def truth_coverage(truths, image_sizes, setup):
    """bool [T] over every image's non-crowd truths in order: best anchor IoU >=
    match_threshold at the eval resize."""
    boxes, image_index = [], []
    for index, truth in enumerate(truths):
        xywh = truth.boxes[~truth.crowd]
        boxes.append(np.c_[xywh[:, 1], xywh[:, 0], xywh[:, 1] + xywh[:, 3],
                           xywh[:, 0] + xywh[:, 2]])
        image_index.append(np.full(len(xywh), index, np.int64))
    boxes = np.concatenate(boxes + [np.zeros((0, 4))])
    box_set = annotated_boxes.BoxSet(
        boxes, np.zeros(len(boxes), np.int64), np.zeros(len(boxes), bool),
        np.concatenate(image_index + [np.zeros(0, np.int64)]),
        np.asarray(image_sizes, np.int64).reshape(-1, 2), ['box'], 'evaluation')
    placed, visible = anchor_coverage.place_boxes(box_set, setup.output_size, [1.0])
    best_iou = anchor_coverage.best_anchor_match(placed[0], setup)[0]
    return visible[0] & (best_iou >= setup.match_threshold)


def _det_columns(result, truths, detections, scales, edges):
    """(bin, class, score, is_true) of every detection in TIDE's AP data: a true positive
    lands in its truth's bin, a false positive in its own."""
    columns = []
    for image, (truth, dets, outcome) in enumerate(zip(truths, detections, result.images)):
        kinds = np.array(outcome.det_kind, dtype=object)
        keep, is_true = kinds != 'ignored', kinds == 'tp'
        order = outcome.det_order
        truth_bins = _bin(np.sqrt(truth.boxes[:, 2] * truth.boxes[:, 3]) * scales[image], edges)
        det_bins = _bin(np.sqrt(dets.boxes[order, 2] * dets.boxes[order, 3]) * scales[image],
                        edges)
        if len(truth_bins):
            det_bins = np.where(is_true, truth_bins[np.maximum(outcome.det_truth, 0)], det_bins)
        columns.append(np.c_[det_bins, dets.classes[order], dets.scores[order], is_true][keep])
    return np.concatenate(columns + [np.zeros((0, 4))])


def size_table(result, truths, detections, scales, coverage=None, edges=SIZE_EDGES):
    """[{'bin', 'truths', 'recall', 'missed_share', 'ap50', 'anchor_coverage'}] per size bin.

    Args:
      result: tide.Analysis of `truths` and `detections`.
      scales: float [M] network pixels per original pixel, per image.
      coverage: bool [T] from truth_coverage, or None (then 'anchor_coverage' is None).
    """
    truth_bins, truth_classes, kinds = [], [], []
    for image, (truth, outcome) in enumerate(zip(truths, result.images)):
        plain = ~truth.crowd
        truth_bins.append(_bin(np.sqrt(truth.boxes[plain, 2] * truth.boxes[plain, 3]) *
                               scales[image], edges))
        truth_classes.append(truth.classes[plain])
        kinds.append(np.array(outcome.truth_kind, dtype=object)[plain])
    truth_bins, truth_classes, kinds = (np.concatenate(parts + [np.zeros(0, dtype)]) for parts, dtype
                                        in ((truth_bins, np.int64), (truth_classes, np.int64),
                                            (kinds, object)))
    dets = _det_columns(result, truths, detections, scales, edges)
    rows = []
    for position, name in enumerate(bin_names(edges)):
        in_bin, det_rows = truth_bins == position, dets[dets[:, 0] == position]
        total = int(in_bin.sum())
        aps = []
        for cls in sorted(set(truth_classes[in_bin].tolist()) | set(det_rows[:, 1].tolist())):
            aps.append(tide.tide_ap(det_rows[det_rows[:, 1] == cls][:, 2:],
                                    int(np.sum(truth_classes[in_bin] == cls))))
        rows.append({'bin': name, 'truths': total,
                     'recall': float(np.mean(kinds[in_bin] == 'tp')) if total else None,
                     'missed_share': float(np.mean(kinds[in_bin] == 'missed')) if total else None,
                     'ap50': float(np.mean(aps)) if aps and total else None,
                     'anchor_coverage': (float(np.mean(coverage[in_bin]))
                                         if coverage is not None and total else None)})
    return rows


def format_table(rows):
    """Text table of size_table rows."""
    def share(value):
        return '   -' if value is None else '%4.0f%%' % (100 * value)
    lines = ['%-13s %7s %6s %7s %7s %16s' % ('size (net px)', 'truths', 'AP50', 'recall',
                                              'missed', 'anchor coverage')]
    for row in rows:
        lines.append('%-13s %7d %6s %7s %7s %16s' % (
            row['bin'], row['truths'], '   -' if row['ap50'] is None else '%.3f' % row['ap50'],
            share(row['recall']), share(row['missed_share']), share(row['anchor_coverage'])))
    return '\n'.join(lines)
