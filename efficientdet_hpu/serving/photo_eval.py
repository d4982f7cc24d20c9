"""Scores `inference.py predict`'s detections.json against a COCO annotation file of the same
photos (`--annotations_file`), e.g. a whole orthophoto predicted tile by tile.

Photos are matched by file name (the JSON's "file_name" basename). Metrics, pycocotools box
evaluation over the matched photos with up to `max_detections` detections per photo:
AP (IoU 0.50:0.95), AP50, and recall at IoU 0.4 (DeepForest's evaluation threshold: the
fraction of annotated boxes matched by a detection at IoU >= 0.4, greedily by score, any
score), averaged over categories as COCO averages.
"""
import contextlib
import io
import json
import os

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from efficientdet_hpu.serving.model_spec import InferenceError

RECALL_IOU = 0.4


def _coco_eval(coco_gt, coco_dt, image_ids, max_detections, iou_thresholds=None):
    evaluator = COCOeval(coco_gt, coco_dt, 'bbox')
    evaluator.params.imgIds = image_ids
    evaluator.params.maxDets = [1, 100, max_detections]
    if iou_thresholds is not None:
        evaluator.params.iouThrs = np.asarray(iou_thresholds, np.float64)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
        evaluator.accumulate()
        if iou_thresholds is None:
            evaluator.summarize()
    return evaluator


def evaluate(results, annotations_file, max_detections=1000):
    """{'photos', 'annotations', 'detections', 'AP', 'AP50', 'recall_iou0.4'} of COCO result
    rows ({'file_name', 'category_id', 'bbox' [x, y, w, h], 'score'}) against the file."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(annotations_file)
    by_name = {os.path.basename(image['file_name']): image['id']
               for image in coco_gt.dataset['images']}
    names = {row['file_name'] for row in results}
    image_ids = sorted(by_name[name] for name in names if name in by_name)
    if not image_ids:
        raise InferenceError('--annotations_file=%s lists none of the predicted photos (%s); '
                             'its images\' file_name must match the input files'
                             % (annotations_file, ', '.join(sorted(names)[:3])))
    rows = [dict(row, image_id=by_name[row['file_name']]) for row in results
            if row['file_name'] in by_name]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(rows)
    main = _coco_eval(coco_gt, coco_dt, image_ids, max_detections)
    loose = _coco_eval(coco_gt, coco_dt, image_ids, max_detections, [RECALL_IOU])
    recall = loose.eval['recall'][0, :, 0, -1]  # [categories] at all areas, max detections.
    return {'photos': len(image_ids),
            'annotations': len(coco_gt.getAnnIds(imgIds=image_ids, iscrowd=False)),
            'detections': len(rows), 'AP': float(main.stats[0]), 'AP50': float(main.stats[1]),
            'recall_iou0.4': float(recall[recall > -1].mean()) if (recall > -1).any() else -1.0}


def evaluate_file(detections_json, annotations_file, max_detections=1000):
    with open(detections_json) as f:
        return evaluate(json.load(f), annotations_file, max_detections)
