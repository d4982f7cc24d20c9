"""COCO box evaluation of detection rows: faster-coco-eval's COCOeval (C++ evaluate and
accumulate, the same 12 numbers as pycocotools', docs/evaluation.md has the timing) when it is
installed, else pycocotools' own; pycocotools is the referee in tests/evaluation/test_coco_metric.py.

Plain Python/numpy: no flags, no Horovod. In distributed evaluation the caller gathers the
per-rank arrays and calls `update_state` on rank 0 only.

Array layouts (docs/CONTRACTS.md), boxes in original image pixels, [ymin, xmin, ymax, xmax]:
  detections        float [N, 7]  rows [image_id, ymin, xmin, ymax, xmax, score, label]
  groundtruth_data  float [batch, max_instances, 7]
                    rows [ymin, xmin, ymax, xmax, is_crowd, area, label], padding rows -1
Labels are contiguous 1..N; `label_map` maps them to the category ids written in every
result and metric. COCO JSON boxes are [x, y, width, height]; conversion happens here only.
"""

import contextlib
import io
import logging
import math
import os

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from efficientdet_hpu.core import atomic_file

try:
    from faster_coco_eval import COCOeval_faster
    # It logs its own copy of the table; format_table prints ours.
    logging.getLogger('faster_coco_eval').setLevel(logging.WARNING)
except ImportError:  # Not installed: pycocotools scores alone, only slower.
    COCOeval_faster = None

EVALUATORS = {'pycocotools': COCOeval}
if COCOeval_faster is not None:
    EVALUATORS['faster_coco_eval'] = COCOeval_faster
DEFAULT_EVALUATOR = 'faster_coco_eval' if COCOeval_faster is not None else 'pycocotools'

# Order and meaning of COCOeval.stats.
METRIC_NAMES = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl',
                'ARmax1', 'ARmax10', 'ARmax100', 'ARs', 'ARm', 'ARl')
PER_CLASS_PREFIX = 'AP_/'

# (kind, IoU range, area, maxDets) of each stat, as COCOeval.summarize prints them.
_TABLE_ROWS = (
    ('AP', '0.50:0.95', 'all', 100), ('AP', '0.50', 'all', 100), ('AP', '0.75', 'all', 100),
    ('AP', '0.50:0.95', 'small', 100), ('AP', '0.50:0.95', 'medium', 100),
    ('AP', '0.50:0.95', 'large', 100),
    ('AR', '0.50:0.95', 'all', 1), ('AR', '0.50:0.95', 'all', 10),
    ('AR', '0.50:0.95', 'all', 100), ('AR', '0.50:0.95', 'small', 100),
    ('AR', '0.50:0.95', 'medium', 100), ('AR', '0.50:0.95', 'large', 100),
)
_PADDING_LABEL = -1


def _quiet():
    """Swallows pycocotools' progress prints (it writes them to stdout)."""
    return contextlib.redirect_stdout(io.StringIO())


class EvaluationMetric:
    """Accumulates detections of many batches and scores them with COCOeval (bbox).

    Ground truth comes from `val_json_file` when given (evaluation is restricted to the image
    ids passed to `update_state`, so evaluating a subset is correct), otherwise from the
    `groundtruth_data` arrays. With `testdev_dir`, `evaluate()` only writes the COCO results
    file `detections_test-dev2017_<testdev_name>_results.json` there and returns {}.

    Decisions:
      * Detection rows with label -1 are padding and dropped, like ground-truth padding.
      * A detection for an image id not passed to `update_state`, an image id passed twice, or
        a label missing from the label map raises ValueError: each means the eval pipeline and
        the ground truth disagree, and a silently wrong AP is worse than a clear error.
      * With `label_map` and a JSON file, only the label map's categories are evaluated.
      * Per-class AP is -1 for a category without ground truth, as COCOeval does for stats.
    """

    def __init__(self, val_json_file=None, label_map=None, testdev_dir=None,
                 class_names=None, testdev_name='efficientdet', evaluator=None):
        """Args:
          val_json_file: COCO instances JSON path, or None to use `groundtruth_data`.
          label_map: dict {label (int 1..N): category_id (int)}, or None for identity.
          testdev_dir: directory for the test-dev results file, or None to evaluate.
          class_names: dict {label: name} for per-class keys, or None (JSON names, else ids).
          testdev_name: the <name> part of the test-dev results file name.
          evaluator: a name of EVALUATORS, or None for DEFAULT_EVALUATOR.
        """
        self.evaluator = evaluator or DEFAULT_EVALUATOR
        if self.evaluator not in EVALUATORS:
            raise ValueError(f'evaluator {self.evaluator!r} is not installed; one of '
                             f'{sorted(EVALUATORS)}')
        self.val_json_file = val_json_file
        self.label_map = ({int(k): int(v) for k, v in label_map.items()}
                          if label_map is not None else None)
        self.class_names = ({int(k): str(v) for k, v in class_names.items()}
                            if class_names is not None else {})
        self.testdev_dir = testdev_dir
        self.testdev_name = testdev_name
        self._json_gt = None  # COCO of val_json_file, loaded once on first evaluate().
        self.scored = None  # evaluate()'s inputs as COCO data, see there.
        self.reset_states()

    def reset_states(self):
        """Forgets everything accumulated by `update_state`."""
        self._image_ids = []
        self._detections = []
        self._groundtruth = []

    def update_state(self, image_ids, detections, groundtruth_data=None):
        """Adds one batch.

        Args:
          image_ids: int [batch], COCO image ids of the batch.
          detections: float [N, 7] rows [image_id, ymin, xmin, ymax, xmax, score, label].
          groundtruth_data: float [batch, max_instances, 7] rows
            [ymin, xmin, ymax, xmax, is_crowd, area, label], padding -1, aligned with
            `image_ids`. Required unless `val_json_file` or `testdev_dir` was given.
        """
        image_ids = np.asarray(image_ids).astype(np.int64).reshape(-1)
        detections = np.asarray(detections, dtype=np.float64)
        if detections.size == 0:
            detections = detections.reshape(0, 7)
        if detections.ndim != 2 or detections.shape[1] != 7:
            raise ValueError(f'detections must be [N, 7] rows [image_id, ymin, xmin, ymax, xmax, '
                             f'score, label]; got shape {detections.shape}')
        self._image_ids.append(image_ids)
        self._detections.append(detections[detections[:, 6] != _PADDING_LABEL])
        if self.val_json_file or self.testdev_dir:
            return
        if groundtruth_data is None:
            raise ValueError('groundtruth_data is required when no val_json_file is given')
        groundtruth_data = np.asarray(groundtruth_data, dtype=np.float64)
        if groundtruth_data.ndim != 3 or groundtruth_data.shape[2] != 7:
            raise ValueError(f'groundtruth_data must be [batch, max_instances, 7]; '
                             f'got shape {groundtruth_data.shape}')
        if groundtruth_data.shape[0] != image_ids.shape[0]:
            raise ValueError(f'groundtruth_data has {groundtruth_data.shape[0]} images but '
                             f'image_ids has {image_ids.shape[0]}')
        self._groundtruth.append(groundtruth_data)

    def evaluate(self):
        """Scores everything accumulated.

        Returns:
          dict, in this order: the 12 METRIC_NAMES (floats, -1 where COCO has nothing to
          average), then 'AP_/<class name>' per evaluated category in label order. {} in
          test-dev mode, after writing the results file.
        """
        image_ids, detections = self._gathered()
        results = self._to_coco_results(detections)
        if self.testdev_dir:
            _write_testdev(results, self.testdev_dir, self.testdev_name)
            return {}
        if self.val_json_file:
            coco_gt, category_ids = self._groundtruth_from_json(image_ids)
        else:
            coco_gt, category_ids = self._groundtruth_from_arrays(image_ids)
        # What the error analysis (analysis/report.py) reads: the scored inputs as COCO data.
        self.scored = {'dataset': coco_gt.dataset, 'results': results, 'image_ids': image_ids,
                       'names': {c: self._category_name(c, coco_gt) for c in category_ids}}
        coco_eval = _run_cocoeval(coco_gt, _load_results(coco_gt, results),
                                  image_ids, category_ids, EVALUATORS[self.evaluator])
        metrics = {name: float(value) for name, value in zip(METRIC_NAMES, coco_eval.stats)}
        for category_id in self._report_order(category_ids):
            name = self._category_name(category_id, coco_gt)
            metrics[PER_CLASS_PREFIX + name] = _category_ap(coco_eval, category_id)
        return metrics

    def _gathered(self):
        """Concatenated image ids int [I] and detections [N, 7], checked against each other."""
        image_ids = (np.concatenate(self._image_ids) if self._image_ids
                     else np.zeros([0], np.int64))
        detections = (np.concatenate(self._detections) if self._detections
                      else np.zeros([0, 7]))
        unique_ids, counts = np.unique(image_ids, return_counts=True)
        if np.any(counts > 1):
            raise ValueError(f'image ids {unique_ids[counts > 1][:10].tolist()} were passed to '
                             'update_state more than once; drop repeated (padding) images first')
        unknown = np.setdiff1d(np.rint(detections[:, 0]).astype(np.int64), unique_ids)
        if unknown.size:
            raise ValueError(f'detections for image ids {unknown[:10].tolist()} that were not '
                             'passed as image_ids to update_state')
        return unique_ids.tolist(), detections

    def _category_ids_of(self, labels, what):
        """Maps labels (float [K], integral, >= 1) to category ids (list of int)."""
        labels = np.rint(labels).astype(np.int64)
        if self.label_map is None:
            bad = sorted(set(labels[labels < 1].tolist()))
            if bad:
                raise ValueError(f'{what} labels {bad} are not contiguous labels >= 1')
            return labels.tolist()
        bad = sorted(set(labels.tolist()) - set(self.label_map))
        if bad:
            raise ValueError(f'{what} labels {bad} are not in the label map (labels '
                             f'{sorted(self.label_map)}); is it the label map of these TFRecords?')
        return [self.label_map[label] for label in labels.tolist()]

    def _to_coco_results(self, detections):
        """Detection rows [N, 7] -> COCO results list (bbox [x, y, w, h])."""
        if self.label_map is not None:
            # A class head wider than the label map (automl's 90 COCO ids, 80 of them used)
            # predicts labels no category has: COCO scoring ignores them, as automl's does.
            labels = np.rint(detections[:, 6]).astype(np.int64)
            detections = detections[np.isin(labels, list(self.label_map))]
        category_ids = self._category_ids_of(detections[:, 6], 'detection')
        results = []
        for row, category_id in zip(detections.tolist(), category_ids):
            image_id, ymin, xmin, ymax, xmax, score, _ = row
            results.append({'image_id': int(round(image_id)), 'category_id': category_id,
                            'bbox': [xmin, ymin, xmax - xmin, ymax - ymin], 'score': score})
        return results

    def _groundtruth_from_json(self, image_ids):
        """(COCO of val_json_file, category ids to evaluate); checks ids against the file."""
        if self._json_gt is None:
            with _quiet():
                self._json_gt = COCO(self.val_json_file)
        missing = sorted(set(image_ids) - set(self._json_gt.getImgIds()))
        if missing:
            raise ValueError(f'image ids {missing[:10]} are not in --val_json_file='
                             f'{self.val_json_file}; were the TFRecords made from another file?')
        category_ids = sorted(self._json_gt.getCatIds())
        if self.label_map is not None:
            unknown = sorted(set(self.label_map.values()) - set(category_ids))
            if unknown:
                raise ValueError(f'label map category ids {unknown} are not categories of '
                                 f'--val_json_file={self.val_json_file}')
            category_ids = sorted(self.label_map.values())
        return self._json_gt, category_ids

    def _groundtruth_from_arrays(self, image_ids):
        """(COCO built from the groundtruth_data rows, category ids to evaluate)."""
        rows = np.concatenate([gt.reshape(-1, 7) for gt in self._groundtruth] +
                              [np.zeros([0, 7])])
        row_image_ids = np.concatenate([np.repeat(ids, gt.shape[1]) for ids, gt
                                        in zip(self._image_ids, self._groundtruth)] +
                                       [np.zeros([0], np.int64)])
        keep = rows[:, 6] != _PADDING_LABEL
        rows, row_image_ids = rows[keep], row_image_ids[keep]
        row_category_ids = self._category_ids_of(rows[:, 6], 'groundtruth')
        annotations = []
        for index, (row, category_id) in enumerate(zip(rows.tolist(), row_category_ids)):
            ymin, xmin, ymax, xmax, is_crowd, area, _ = row
            annotations.append({'id': index + 1, 'image_id': int(row_image_ids[index]),
                                'category_id': category_id, 'iscrowd': int(round(is_crowd)),
                                'area': area, 'bbox': [xmin, ymin, xmax - xmin, ymax - ymin]})
        if self.label_map is not None:
            category_ids = sorted(self.label_map.values())
        else:
            category_ids = sorted(set(row_category_ids) | set(self.class_names))
        dataset = {'images': [{'id': image_id} for image_id in image_ids],
                   'annotations': annotations,
                   'categories': [{'id': category_id, 'name': str(category_id)}
                                  for category_id in category_ids]}
        return _coco_from_dataset(dataset), category_ids

    def _report_order(self, category_ids):
        """Category ids in label order when a label map is known, else in id order."""
        if self.label_map is None:
            return list(category_ids)
        return [self.label_map[label] for label in sorted(self.label_map)]

    def _category_name(self, category_id, coco_gt):
        """class_names entry, else the ground truth's category name, else the id."""
        labels = ([label for label, cat in self.label_map.items() if cat == category_id]
                  if self.label_map is not None else [category_id])
        if labels and labels[0] in self.class_names:
            return self.class_names[labels[0]]
        return str(coco_gt.cats[category_id].get('name', category_id))


def _coco_from_dataset(dataset):
    """COCO object over an in-memory dataset dict (images, annotations, categories)."""
    coco = COCO()
    coco.dataset = dataset
    with _quiet():
        coco.createIndex()
    return coco


def _load_results(coco_gt, results):
    """COCO of the results list; loadRes cannot take an empty list, so build that one."""
    if results:
        with _quiet():
            return coco_gt.loadRes(results)
    return _coco_from_dataset({'images': list(coco_gt.dataset['images']),
                               'categories': list(coco_gt.dataset['categories']),
                               'annotations': []})


def _run_cocoeval(coco_gt, coco_dt, image_ids, category_ids, evaluator=COCOeval):
    """Runs `evaluator` (a COCOeval class) bbox on the given images and categories; returns
    it summarized."""
    coco_eval = evaluator(coco_gt, coco_dt, iouType='bbox')
    coco_eval.params.imgIds = list(image_ids)
    coco_eval.params.catIds = list(category_ids)
    with _quiet():
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return coco_eval


def _category_ap(coco_eval, category_id):
    """AP @[IoU=.50:.95, area all, maxDets 100] of one category; -1 without ground truth."""
    params = coco_eval.params
    if category_id not in params.catIds:
        return -1.0
    # precision is [iou T, recall R=101, category K, area A, maxDets M], -1 = nothing to score.
    precision = coco_eval.eval['precision'][:, :, params.catIds.index(category_id),
                                            params.areaRngLbl.index('all'),
                                            params.maxDets.index(100)]
    scored = precision[precision > -1]
    return float(np.mean(scored)) if scored.size else -1.0


def _write_testdev(results, testdev_dir, name):
    """Writes the COCO results list for the test-dev server; returns its path."""
    path = os.path.join(testdev_dir, f'detections_test-dev2017_{name}_results.json')
    atomic_file.write_json_atomically(path, results, allow_nan=False)
    return path


def format_table(metrics):
    """The 12 COCO stats in pycocotools' wording, then one 'name AP' line per class.

    Args:
      metrics: dict from `EvaluationMetric.evaluate` (all METRIC_NAMES present).
    Returns:
      str, lines joined by newlines, no trailing newline.
    """
    missing = [name for name in METRIC_NAMES if name not in metrics]
    if missing:
        raise ValueError(f'metrics lack {missing}; format_table needs evaluate() output '
                         '(test-dev mode returns {})')
    lines = []
    for name, (kind, iou, area, max_dets) in zip(METRIC_NAMES, _TABLE_ROWS):
        title = 'Average Precision' if kind == 'AP' else 'Average Recall'
        lines.append(f' {title:<18} ({kind}) @[ IoU={iou:<9} | area={area:>6s} | '
                     f'maxDets={max_dets:>3d} ] = {metrics[name]:0.3f}')
    per_class = [(key[len(PER_CLASS_PREFIX):], value) for key, value in metrics.items()
                 if key.startswith(PER_CLASS_PREFIX)]
    if per_class:
        width = max(len(name) for name, _ in per_class)
        lines.append(' Per-class AP @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]')
        lines.extend(f'   {name:<{width}}  {value:0.3f}' for name, value in per_class)
    return '\n'.join(lines)


def _json_value(value):
    """Python float for numpy/Python numbers; None for NaN/inf so the JSON stays strict."""
    value = float(value)
    return value if math.isfinite(value) else None


def write_metrics_json(metrics, model_dir, step):
    """Writes model_dir/eval/metrics-<step>.json and model_dir/eval/metrics_latest.json.

    Both hold {"step": int, "metrics": {name: float or null}} with NaN/inf as null and the
    metrics' order kept; each file is replaced atomically. Returns the per-step path.
    """
    payload = {'step': int(step),
               'metrics': {str(name): _json_value(value) for name, value in metrics.items()}}
    eval_dir = os.path.join(model_dir, 'eval')
    step_path = os.path.join(eval_dir, f'metrics-{int(step)}.json')
    atomic_file.write_json_atomically(step_path, payload, allow_nan=False)
    atomic_file.write_json_atomically(os.path.join(eval_dir, 'metrics_latest.json'), payload,
                                      allow_nan=False)
    return step_path
