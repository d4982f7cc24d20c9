"""Scores `inference.py predict`'s detections.json against a COCO annotation file of the same
photos (`--annotations_file`), e.g. a whole orthophoto predicted tile by tile.

Photos are matched by file name (the JSON's "file_name" basename). Metrics, pycocotools box
evaluation over the matched photos with every detection of a photo counted (COCO's cap of 100
per image, or any fixed cap, would cut a whole orthophoto's thousands of trees):
AP (IoU 0.50:0.95), AP50, and recall at IoU 0.4 (DeepForest's evaluation threshold: the
fraction of annotated boxes matched by a detection at IoU >= 0.4, greedily by score, any
score), averaged over categories as COCO averages.

Memory: pycocotools' IoU matrices are dense (detections x annotations per photo and class);
past DENSE_LIMIT pairs (a whole orthophoto: 128,907 x 22,320 needs 23 GB) and without crowd
boxes the same numbers come from evaluation/sparse_coco.py, which compares only boxes that
overlap (tests check the two agree).
"""
import collections
import contextlib
import io
import json
import os

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.evaluation import sparse_coco

RECALL_IOU = 0.4
COCO_IOUS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
DENSE_LIMIT = 20_000_000  # Detection x annotation pairs (160 MB of IoUs) for pycocotools.


class PhotoEvalError(UserError, ValueError):
    """Annotations that do not fit the detections (no photo in common); the message names
    the file and the fix. inference.py prints it as one line, as its other input errors."""


def _coco_eval(coco_gt, coco_dt, image_ids, max_detections, iou_thresholds=None):
    evaluator = COCOeval(coco_gt, coco_dt, 'bbox')
    evaluator.params.imgIds = image_ids
    evaluator.params.maxDets = [1, 100, max_detections]
    if iou_thresholds is not None:
        evaluator.params.iouThrs = np.asarray(iou_thresholds, np.float64)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
        evaluator.accumulate()
    return evaluator


def _mean_valid(values):
    return float(values[values > -1].mean()) if (values > -1).any() else -1.0


def _no_results(coco_gt):
    """An empty results set (pycocotools' loadRes cannot take none)."""
    empty = COCO()
    empty.dataset = dict(coco_gt.dataset, annotations=[])
    with contextlib.redirect_stdout(io.StringIO()):
        empty.createIndex()
    return empty


def evaluate(results, annotations_file, max_detections=None, dense_limit=DENSE_LIMIT,
             photos=None, say=None):
    """{'photos', 'annotations', 'detections', 'AP', 'AP50', 'recall_iou0.4'} of COCO result
    rows ({'file_name', 'category_id', 'bbox' [x, y, w, h], 'score'}) against the file.
    photos: the file names predicted (a photo without detections scores its boxes as missed);
    default: those of the rows. say(line), when given, hears what is scored before the
    scoring (whole orthophotos can take minutes)."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(annotations_file)
    by_name = {os.path.basename(image['file_name']): image['id']
               for image in coco_gt.dataset['images']}
    names = {row['file_name'] for row in results} | set(photos or ())
    image_ids = sorted(by_name[name] for name in names if name in by_name)
    if not image_ids:
        raise PhotoEvalError('--annotations_file=%s lists none of the predicted photos (%s); '
                             'its images\' file_name must match the input files'
                             % (annotations_file, ', '.join(sorted(names)[:3])))
    rows = [dict(row, image_id=by_name[row['file_name']]) for row in results
            if row['file_name'] in by_name]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(rows) if rows else _no_results(coco_gt)
    if max_detections is None:  # All of them: the most any photo has (at least COCO's 100).
        per_photo = collections.Counter(row['image_id'] for row in rows)
        max_detections = max([100] + list(per_photo.values()))
    if say is not None:
        say('scoring %d detections of %d photo(s) against %s' % (
            len(rows), len(image_ids), annotations_file))
    precision, recall = _scores(coco_gt, coco_dt, image_ids, max_detections, dense_limit)
    return {'photos': len(image_ids),
            'annotations': len(coco_gt.getAnnIds(imgIds=image_ids, iscrowd=False)),
            'detections': len(rows), 'AP': _mean_valid(precision),
            'AP50': _mean_valid(precision[0]), 'recall_iou0.4': _mean_valid(recall)}


def _pairs(coco_gt, coco_dt, image_ids):
    """Detection x annotation pairs pycocotools' dense IoU matrices would hold."""
    total = 0
    for image_id in image_ids:
        truths = collections.Counter(a['category_id'] for a in coco_gt.imgToAnns[image_id])
        dets = collections.Counter(a['category_id'] for a in coco_dt.imgToAnns[image_id])
        total += sum(count * truths[category] for category, count in dets.items())
    return total


def _scores(coco_gt, coco_dt, image_ids, max_detections, dense_limit):
    """(precision [IoU 0.50:0.95, recall points, categories], recall at IoU 0.4 [categories])
    at area 'all' and max_detections per photo."""
    crowd = any(a.get('iscrowd', 0) for i in image_ids for a in coco_gt.imgToAnns[i])
    if crowd or _pairs(coco_gt, coco_dt, image_ids) <= dense_limit:
        main = _coco_eval(coco_gt, coco_dt, image_ids, max_detections)
        loose = _coco_eval(coco_gt, coco_dt, image_ids, max_detections, [RECALL_IOU])
        # From the accumulated arrays at all areas and the last cap: pycocotools' summarize()
        # takes its AP at a fixed 100 detections per image whatever maxDets says.
        return main.eval['precision'][:, :, :, 0, -1], loose.eval['recall'][0, :, 0, -1]
    images = [([(a['bbox'], a['category_id']) for a in coco_gt.imgToAnns[i]],
               [(a['bbox'], a['category_id'], a['score']) for a in coco_dt.imgToAnns[i]])
              for i in image_ids]
    precision, recall = sparse_coco.evaluate(images, sorted(coco_gt.getCatIds()),
                                             list(COCO_IOUS) + [RECALL_IOU], max_detections)
    return precision[:-1], recall[-1]


def _print_line(line):
    print(line, flush=True)


def evaluate_file(detections_json, annotations_file, max_detections=None, photos=None,
                  say=_print_line):
    """evaluate() of a detections JSON file, saying what it scores (on stdout by default)."""
    with open(detections_json) as f:
        return evaluate(json.load(f), annotations_file, max_detections, photos=photos, say=say)
