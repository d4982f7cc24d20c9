"""COCO box AP and recall for photos with tens of thousands of objects, in bounded memory.

pycocotools' COCOeval builds, per image and category, the dense IoU matrix of all detections
against all ground truth: a 10k x 10k orthophoto with 22,320 trees and 128,907 detections
needs 23 GB for it (measured: the process was killed). Two boxes with IoU >= t > 0 overlap, so
this module computes IoU (pycocotools' own function) only between a detection and the ground
truth boxes it overlaps (found through a grid of cells) and otherwise follows COCOeval step for step: ground truth in file
order, detections sorted by score with a stable sort (ties in input order), each detection
taking the unmatched ground truth of highest IoU >= t (a later box wins a tie), the images'
detections merged by score with a stable sort, precision made monotone and read at the 101
recall points. Area range 'all' only, and no crowd boxes (photo_eval uses pycocotools itself
when there are). tests/data/test_tiling.py checks the numbers equal pycocotools'.
"""
import collections
import math

import numpy as np

from efficientdet_hpu.analysis import tide

RECALL_POINTS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
_CELL = 64.0  # Grid cell in pixels for finding overlapping boxes.


def _cells(box):
    """Grid cells an xywh box touches."""
    x, y, w, h = box
    return [(i, j) for i in range(int(math.floor(x / _CELL)), int(math.floor((x + w) / _CELL)) + 1)
            for j in range(int(math.floor(y / _CELL)), int(math.floor((y + h) / _CELL)) + 1)]


def _candidates(det_boxes, truth_boxes, min_iou):
    """Per detection: (truth indices ascending, their IoUs) with IoU >= min_iou."""
    grid = collections.defaultdict(list)
    for index, box in enumerate(truth_boxes.tolist()):
        for cell in _cells(box):
            grid[cell].append(index)
    found = []
    for box in det_boxes.tolist():
        near = sorted({index for cell in _cells(box) for index in grid.get(cell, ())})
        if not near:
            found.append((np.zeros(0, np.int64), np.zeros(0)))
            continue
        near = np.asarray(near, np.int64)
        # pycocotools' own IoU (analysis/tide.py wraps it), so the values are its values.
        ious = tide.iou_matrix(np.asarray([box], np.float64), truth_boxes[near],
                               np.zeros(len(near)))[0]
        keep = ious >= min_iou
        found.append((near[keep], ious[keep]))
    return found


def _match(candidates, num_truths, threshold):
    """bool [D] matched, COCOeval's greedy rule at one IoU threshold (no crowd boxes)."""
    taken = np.zeros(num_truths, bool)
    matched = np.zeros(len(candidates), bool)
    limit = min(threshold, 1 - 1e-10)
    for index, (truths, ious) in enumerate(candidates):
        best, best_iou = -1, limit
        for truth, iou in zip(truths.tolist(), ious.tolist()):
            if taken[truth] or iou < best_iou:
                continue
            best, best_iou = truth, iou
        if best >= 0:
            taken[best] = True
            matched[index] = True
    return matched


def _precision(matched, num_truths):
    """COCOeval.accumulate's precision at the recall points [R] and the final recall."""
    tp = np.cumsum(matched).astype(np.float64)
    fp = np.cumsum(~matched).astype(np.float64)
    recall = tp / num_truths
    precision = (tp / (fp + tp + np.spacing(1))).tolist()
    for i in range(len(precision) - 1, 0, -1):
        if precision[i] > precision[i - 1]:
            precision[i - 1] = precision[i]
    points = np.zeros(len(RECALL_POINTS))
    for r, p in enumerate(np.searchsorted(recall, RECALL_POINTS, side='left').tolist()):
        if p >= len(precision):
            break
        points[r] = precision[p]
    return points, (recall[-1] if len(recall) else 0.0)


def evaluate(images, categories, thresholds, max_dets):
    """precision [T, R, K] and recall [T, K] as COCOeval.accumulate gives them at area 'all'
    and maxDets `max_dets` (-1 for a category without ground truth).

    images: [(truths, detections)] in image-id order; truths [(xywh, category)] in the
    annotation file's order, detections [(xywh, category, score)] in the results' order."""
    precision = -np.ones((len(thresholds), len(RECALL_POINTS), len(categories)))
    recall = -np.ones((len(thresholds), len(categories)))
    for k, category in enumerate(categories):
        scores, matched, num_truths = [], [], 0
        for truths, detections in images:
            boxes = np.array([b for b, c in truths if c == category], np.float64).reshape(-1, 4)
            mine = [(b, s) for b, c, s in detections if c == category]
            order = np.argsort([-s for _, s in mine], kind='mergesort')[:max_dets]
            dets = np.array([mine[i][0] for i in order], np.float64).reshape(-1, 4)
            found = _candidates(dets, boxes, min(thresholds))
            num_truths += len(boxes)
            scores.append(np.array([mine[i][1] for i in order], np.float64))
            matched.append(np.stack([_match(found, len(boxes), t) for t in thresholds])
                           if len(dets) else np.zeros((len(thresholds), 0), bool))
        if not num_truths:
            continue
        merged = np.argsort(-np.concatenate(scores), kind='mergesort')
        flags = np.concatenate(matched, axis=1)[:, merged]
        for t in range(len(thresholds)):
            precision[t, :, k], recall[t, k] = _precision(flags[t], num_truths)
    return precision, recall
