"""AP50 and recall by object size in network-input pixels, next to the anchor coverage of each
size bin (the data doctor's measure: the share of boxes whose best anchor reaches the recipe's
match_threshold).

Sizes are sqrt(width * height) after the eval resize (data/anchor_coverage.py's geometry,
scale multiplier 1). Per bin: recall is the share of its truths TIDE matched at IoU 0.5;
missed is the share no detection came near (TIDE's missed type); AP50 is TIDE's AP over the
bin's truths, the true positives that took them, and the false positives whose own size falls
in the bin (COCO's area-range rule).
"""
import collections

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


def size_table(result, truths, detections, scales, coverage=None, edges=SIZE_EDGES):
    """[{'bin', 'truths', 'recall', 'missed_share', 'ap50', 'anchor_coverage'}] per size bin.

    Args:
      result: tide.Analysis of `truths` and `detections`.
      scales: float [M] network pixels per original pixel, per image.
      coverage: bool [T] from truth_coverage, or None (then 'anchor_coverage' is None).
    """
    bins = len(edges) - 1
    counts, matched, missed = (np.zeros(bins, np.int64) for _ in range(3))
    num_truth = collections.defaultdict(lambda: collections.defaultdict(int))
    points = collections.defaultdict(lambda: collections.defaultdict(list))
    truth_bins = []
    for image, (truth, dets, outcome) in enumerate(zip(truths, detections, result.images)):
        sizes = np.sqrt(truth.boxes[:, 2] * truth.boxes[:, 3]) * scales[image]
        where = _bin(sizes, edges)
        for box, kind in enumerate(outcome.truth_kind):
            if kind == 'crowd':
                continue
            counts[where[box]] += 1
            matched[where[box]] += kind == 'tp'
            missed[where[box]] += kind == 'missed'
            num_truth[where[box]][int(truth.classes[box])] += 1
        truth_bins.append(where[~truth.crowd])
        det_sizes = np.sqrt(dets.boxes[:, 2] * dets.boxes[:, 3]) * scales[image]
        for rank, index in enumerate(outcome.det_order.tolist()):
            kind, cls = outcome.det_kind[rank], int(dets.classes[index])
            if kind == 'ignored':
                continue
            target = where[outcome.det_truth[rank]] if kind == 'tp' else _bin(
                det_sizes[index:index + 1], edges)[0]
            points[target][cls].append((float(dets.scores[index]), kind == 'tp'))
    truth_bins = np.concatenate(truth_bins + [np.zeros(0, np.int64)])
    rows = []
    for position, name in enumerate(bin_names(edges)):
        classes = set(num_truth[position]) | set(points[position])
        aps = [tide.tide_ap(points[position][cls], num_truth[position][cls]) for cls in classes]
        total = int(counts[position])
        in_bin = truth_bins == position
        rows.append({'bin': name, 'truths': total,
                     'recall': float(matched[position] / total) if total else None,
                     'missed_share': float(missed[position] / total) if total else None,
                     'ap50': float(np.mean(aps)) if aps and total else None,
                     'anchor_coverage': (float(np.mean(coverage[in_bin]))
                                         if coverage is not None and in_bin.any() else None)})
    return rows


def format_table(rows):
    """Text table of size_table rows."""
    def share(value):
        return '   -' if value is None else '%4.0f%%' % (100 * value)
    lines = ['%-12s %7s %6s %7s %7s %16s' % ('size (net px)', 'truths', 'AP50', 'recall',
                                              'missed', 'anchor coverage')]
    for row in rows:
        lines.append('%-13s %7d %6s %7s %7s %16s' % (
            row['bin'], row['truths'], '   -' if row['ap50'] is None else '%.3f' % row['ap50'],
            share(row['recall']), share(row['missed_share']), share(row['anchor_coverage'])))
    return '\n'.join(lines)
