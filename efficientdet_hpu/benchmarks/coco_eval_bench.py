"""pycocotools against faster-coco-eval on one COCO-size detection set: the same 12 numbers?
how long does each take? (`python bench.py coco_eval --images=5000`)

Generates (fixed seed) `images` images of 640x480 with 7 ground-truth boxes each over 80
classes and `detections` detections each: 60% jittered copies of a truth (class kept 80% of
the time), the rest random boxes, scores uniform. Times evaluate + accumulate + summarize of
each library on the same in-memory data, single process, and prints the 12 stats of both.
"""
import contextlib
import io
import logging
import time
import types

import numpy as np


def generate(images, detections, classes=80, truths=7, seed=0):
    """(COCO instances dict, COCO results list)."""
    rng = np.random.default_rng(seed)
    dataset = {'images': [], 'annotations': [],
               'categories': [{'id': c, 'name': str(c)} for c in range(1, classes + 1)]}
    results = []
    for image_id in range(1, images + 1):
        dataset['images'].append({'id': image_id, 'width': 640, 'height': 480,
                                  'file_name': '%d.jpg' % image_id})
        size = rng.uniform(8, 200, (truths, 2))
        corner = rng.uniform(0, 1, (truths, 2)) * (np.array([640, 480]) - size)
        labels = rng.integers(1, classes + 1, truths)
        for box, label in zip(np.c_[corner, size].tolist(), labels.tolist()):
            dataset['annotations'].append({
                'id': len(dataset['annotations']) + 1, 'image_id': image_id, 'bbox': box,
                'category_id': label, 'area': box[2] * box[3], 'iscrowd': 0})
        source = rng.integers(0, truths, detections)
        near = rng.random(detections) < 0.6
        boxes = np.c_[rng.uniform(0, 600, (detections, 2)), rng.uniform(4, 200, (detections, 2))]
        boxes[near] = np.c_[corner, size][source[near]] * rng.normal(1, 0.08, (int(near.sum()), 4))
        det_labels = np.where(near & (rng.random(detections) < 0.8), labels[source],
                              rng.integers(1, classes + 1, detections))
        for box, label, score in zip(boxes.tolist(), det_labels.tolist(),
                                     rng.random(detections).tolist()):
            results.append({'image_id': image_id, 'category_id': label, 'bbox': box,
                            'score': score})
    return dataset, results


def _evaluate(coco_module, eval_module, dataset, results):
    """(12 stats, seconds of evaluate + accumulate + summarize)."""
    with contextlib.redirect_stdout(io.StringIO()):
        truth = coco_module.COCO()
        truth.dataset = dataset
        truth.createIndex()
        found = truth.loadRes(results)
        evaluator = eval_module.COCOeval(truth, found, 'bbox')
        start = time.perf_counter()
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
        seconds = time.perf_counter() - start
    return np.asarray(evaluator.stats[:12], np.float64), seconds


def measure(images, detections):
    """{'pycocotools': (stats, s), 'faster_coco_eval': (stats, s) or None} on one set."""
    from pycocotools import coco, cocoeval  # pylint: disable=import-outside-toplevel
    dataset, results = generate(images, detections)
    measured = {'pycocotools': _evaluate(coco, cocoeval, dataset, results)}
    try:
        import faster_coco_eval  # pylint: disable=import-outside-toplevel
        logging.getLogger('faster_coco_eval').setLevel(logging.WARNING)
    except ImportError:
        measured['faster_coco_eval'] = None
        return measured
    # faster-coco-eval's names, pycocotools' interface.
    faster = types.SimpleNamespace(COCO=faster_coco_eval.COCO,
                                   COCOeval=faster_coco_eval.COCOeval_faster)
    measured['faster_coco_eval'] = _evaluate(faster, faster, dataset, results)
    return measured


COLUMNS = (('evaluator', 'evaluator', '%s'), ('seconds', 'seconds', '%.1f'),
           ('AP', 'AP', '%.4f'), ('AP50', 'AP50', '%.4f'), ('ARmax100', 'ARmax100', '%.4f'),
           ('max |diff| of 12', 'max_diff', '%.1e'))
STAT_NAMES = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl',
              'ARmax1', 'ARmax10', 'ARmax100', 'ARs', 'ARm', 'ARl')


def rows(measured):
    """Table rows: per evaluator its time, the 12 stats and their largest difference from
    pycocotools'."""
    reference = measured['pycocotools'][0]
    table = []
    for name, value in measured.items():
        if value is None:
            continue
        stats, seconds = value
        row = {'evaluator': name, 'seconds': seconds,
               'max_diff': float(np.max(np.abs(stats - reference)))}
        row.update(zip(STAT_NAMES, stats.tolist()))
        table.append(row)
    return table
