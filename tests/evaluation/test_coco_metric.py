"""Tests of coco_metric against ground truths whose COCO AP is worked out by hand.

COCOeval facts the hand computations use (pycocotools cocoeval.py):
  * IoU thresholds .50:.05:.95 (10); a detection matches when IoU >= threshold.
  * Detections of all images of a category are sorted by score; recall = TP / #GT,
    precision = TP / (TP + FP). Precision is made non-increasing from the right, then read
    at 101 recall thresholds 0, .01, ..., 1 at the first point with recall >= threshold
    (0 beyond the last recall). AP = mean of those 101 values, then over thresholds.
  * A detection matched to a crowd region (IoU = intersection / detection area) is ignored.
"""

import contextlib
import io
import json
import math
import os

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from efficientdet_hpu.evaluation import coco_metric


def groundtruth(images, max_instances=4):
    """float [len(images), max_instances, 7] from per-image lists of
    (ymin, xmin, ymax, xmax, is_crowd, label); area = box area; padding rows -1."""
    data = -np.ones([len(images), max_instances, 7], np.float32)
    for i, boxes in enumerate(images):
        for j, (ymin, xmin, ymax, xmax, is_crowd, label) in enumerate(boxes):
            data[i, j] = [ymin, xmin, ymax, xmax, is_crowd, (ymax - ymin) * (xmax - xmin), label]
    return data


def detections(*rows):
    """float [N, 7] rows [image_id, ymin, xmin, ymax, xmax, score, label]."""
    return np.array(rows, np.float32).reshape(-1, 7)


def evaluate(image_ids, dets, gt=None, **kwargs):
    metric = coco_metric.EvaluationMetric(**kwargs)
    metric.update_state(image_ids, dets, gt)
    return metric.evaluate()


def test_perfect_detections_score_one():
    # Image 1: a 10x10 (small) box of label 1 and a 50x50 (medium) box of label 2.
    # Image 2: a 40x40 (medium) box of label 1. No large boxes -> APl, ARl = -1.
    gt = groundtruth([[(0, 0, 10, 10, 0, 1), (20, 20, 70, 70, 0, 2)],
                      [(5, 5, 45, 45, 0, 1)]])
    dets = detections([1, 0, 0, 10, 10, .9, 1], [1, 20, 20, 70, 70, .8, 2],
                      [2, 5, 5, 45, 45, .7, 1])
    metrics = evaluate([1, 2], dets, gt)
    expected = dict(AP=1, AP50=1, AP75=1, APs=1, APm=1, APl=-1,
                    ARmax1=1, ARmax10=1, ARmax100=1, ARs=1, ARm=1, ARl=-1)
    expected.update({'AP_/1': 1, 'AP_/2': 1})
    assert list(metrics) == list(coco_metric.METRIC_NAMES) + ['AP_/1', 'AP_/2']
    assert metrics == pytest.approx(expected, abs=1e-12)


def test_tp_fp_tp_follows_101_point_interpolation():
    # One image, GT boxes A and B. Detections by score: on A (TP), nowhere (FP), on B (TP),
    # all with IoU 1 or 0, so every IoU threshold gives the same curve:
    #   recall    .5  .5  1
    #   precision  1  .5  2/3  -> non-increasing from the right: 1, 2/3, 2/3
    # Recall thresholds 0..0.50 (51 of them) read precision 1; 0.51..1.00 (50) read 2/3.
    gt = groundtruth([[(0, 0, 20, 20, 0, 1), (50, 50, 70, 70, 0, 1)]])
    dets = detections([1, 0, 0, 20, 20, .9, 1], [1, 100, 100, 120, 120, .8, 1],
                      [1, 50, 50, 70, 70, .7, 1])
    metrics = evaluate([1], dets, gt)
    expected_ap = (51 * 1.0 + 50 * (2.0 / 3.0)) / 101
    for name in ('AP', 'AP50', 'AP75', 'APs', 'AP_/1'):
        assert metrics[name] == pytest.approx(expected_ap, rel=1e-12), name
    # At most 1 detection per image: only the TP on A, recall 1/2. At 10: both TPs.
    assert metrics['ARmax1'] == pytest.approx(0.5)
    assert metrics['ARmax10'] == pytest.approx(1.0)


@pytest.mark.parametrize('is_crowd, expected_ap', [
    # The crowd region soaks up the detection inside it: only the TP on A is scored.
    (1, 1.0),
    # As a plain box, the region is a missed GT and the detection inside it (IoU 400/10000)
    # a FP ranked first: recall 0, .5 / precision 0, .5 -> .5, .5 after the right-max;
    # thresholds 0..0.50 (51) read .5, the rest 0.
    (0, 51 * 0.5 / 101),
])
def test_detection_in_crowd_region_is_ignored(is_crowd, expected_ap):
    gt = groundtruth([[(0, 0, 20, 20, 0, 1), (50, 50, 150, 150, is_crowd, 1)]])
    dets = detections([1, 60, 60, 80, 80, .95, 1], [1, 0, 0, 20, 20, .9, 1])
    assert evaluate([1], dets, gt)['AP'] == pytest.approx(expected_ap, rel=1e-12)


def test_iou_062_matches_at_three_of_ten_thresholds():
    # GT 100x100, detection its top 62 rows: IoU = 6200 / 10000 = 0.62, a TP at
    # .50 .55 .60 (AP 1 each) and a FP at .65 ... .95 (AP 0 each): AP = 3/10.
    gt = groundtruth([[(0, 0, 100, 100, 0, 1)]])
    dets = detections([1, 0, 0, 62, 100, .9, 1])
    metrics = evaluate([1], dets, gt)
    assert metrics['AP50'] == pytest.approx(1.0)
    assert metrics['AP75'] == pytest.approx(0.0)
    assert metrics['AP'] == pytest.approx(0.3, rel=1e-12)
    assert metrics['APl'] == pytest.approx(0.3, rel=1e-12)  # the GT is large (10000 px)
    assert metrics['ARmax100'] == pytest.approx(0.3, rel=1e-12)


def test_detection_on_image_without_groundtruth_is_false_positive():
    # Image 2 has no GT. By score: FP on image 2, TP on image 1 -> recall 0, 1 /
    # precision 0, .5 -> .5, .5 after the right-max; all 101 thresholds read .5.
    gt = groundtruth([[(0, 0, 20, 20, 0, 1)], []])
    dets = detections([2, 0, 0, 20, 20, .9, 1], [1, 0, 0, 20, 20, .5, 1])
    assert evaluate([1, 2], dets, gt)['AP'] == pytest.approx(0.5, rel=1e-12)


NON_CONTIGUOUS = dict(label_map={1: 17, 2: 3}, class_names={1: 'cat', 2: 'dog'})


def test_non_contiguous_category_ids():
    # Label 1 (category 17) found exactly, label 2 (category 3) only missed: APs 1 and 0.
    gt = groundtruth([[(0, 0, 20, 20, 0, 1)], [(0, 0, 20, 20, 0, 2)]])
    dets = detections([1, 0, 0, 20, 20, .9, 1], [2, 50, 50, 70, 70, .9, 2])
    metrics = evaluate([1, 2], dets, gt, **NON_CONTIGUOUS)
    assert list(metrics)[12:] == ['AP_/cat', 'AP_/dog']
    assert metrics['AP_/cat'] == pytest.approx(1.0)
    assert metrics['AP_/dog'] == pytest.approx(0.0)
    assert metrics['AP'] == pytest.approx(0.5)


# Three evaluated images with crowd, small/large boxes, two classes and an image without GT;
# image 42 is in the JSON only, so its GT box must not count as a miss.
SCENE_IDS = [5, 9, 11]
SCENE_ROWS = [[(10, 10, 60, 60, 0, 1), (100, 120, 140, 200, 0, 1),
               (0, 200, 100, 300, 1, 1), (70, 10, 78, 20, 0, 2)],
              [(0, 0, 200, 150, 0, 2)],
              []]
SCENE_JSON = {
    'images': [{'id': i, 'width': 320, 'height': 320} for i in (5, 9, 11, 42)],
    'categories': [{'id': 7, 'name': 'seven'}, {'id': 4, 'name': 'four'}],
    'annotations': [  # bbox [x, y, w, h] of the rows above
        {'id': 1, 'image_id': 5, 'category_id': 7, 'iscrowd': 0, 'area': 2500,
         'bbox': [10, 10, 50, 50]},
        {'id': 2, 'image_id': 5, 'category_id': 7, 'iscrowd': 0, 'area': 3200,
         'bbox': [120, 100, 80, 40]},
        {'id': 3, 'image_id': 5, 'category_id': 7, 'iscrowd': 1, 'area': 10000,
         'bbox': [200, 0, 100, 100]},
        {'id': 4, 'image_id': 5, 'category_id': 4, 'iscrowd': 0, 'area': 80,
         'bbox': [10, 70, 10, 8]},
        {'id': 5, 'image_id': 9, 'category_id': 4, 'iscrowd': 0, 'area': 30000,
         'bbox': [0, 0, 150, 200]},
        {'id': 6, 'image_id': 42, 'category_id': 7, 'iscrowd': 0, 'area': 400,
         'bbox': [0, 0, 20, 20]},
    ]}
SCENE_DETECTIONS = detections(
    [5, 12, 8, 61, 58, .9, 1], [5, 100, 120, 130, 200, .6, 1], [5, 10, 210, 50, 250, .8, 1],
    [5, 70, 10, 78, 19, .3, 2], [9, 0, 0, 180, 150, .7, 2], [9, 0, 0, 50, 50, .75, 1],
    [11, 30, 30, 90, 90, .85, 1], [11, 0, 0, 10, 10, .2, 2])
SCENE_LABEL_MAP = {1: 7, 2: 4}


def write_scene_json(tmp_path):
    path = tmp_path / 'instances_val.json'
    path.write_text(json.dumps(SCENE_JSON))
    return str(path)


def test_array_and_json_groundtruth_agree(tmp_path):
    from_arrays = evaluate(SCENE_IDS, SCENE_DETECTIONS, groundtruth(SCENE_ROWS),
                           label_map=SCENE_LABEL_MAP, class_names={1: 'seven', 2: 'four'})
    from_json = evaluate(SCENE_IDS, SCENE_DETECTIONS, label_map=SCENE_LABEL_MAP,
                         val_json_file=write_scene_json(tmp_path))
    assert list(from_arrays) == list(from_json)
    assert from_arrays == pytest.approx(from_json, abs=1e-12)
    assert 0 < from_json['AP'] < 1


@pytest.mark.parametrize('use_json', [False, True])
def test_empty_detections_score_zero(tmp_path, use_json):
    kwargs = ({'val_json_file': write_scene_json(tmp_path)} if use_json
              else {'gt': groundtruth(SCENE_ROWS), 'class_names': {1: 'seven', 2: 'four'}})
    padding_only = -np.ones([3, 7], np.float32)
    for dets in (np.zeros([0, 7], np.float32), padding_only):
        metrics = evaluate(SCENE_IDS, dets, label_map=SCENE_LABEL_MAP, **kwargs)
        for name in ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl', 'ARmax100', 'ARl'):
            assert metrics[name] == 0.0, name
        assert metrics['AP_/seven'] == 0.0 and metrics['AP_/four'] == 0.0


def test_testdev_writes_results_with_category_ids(tmp_path):
    metric = coco_metric.EvaluationMetric(testdev_dir=str(tmp_path), testdev_name='d0',
                                          **NON_CONTIGUOUS)
    metric.update_state([1, 2], detections([1, 10, 20, 30, 60, .9, 1],
                                           [2, 0, 0, 5, 5, .5, 2], [2, -1, -1, -1, -1, -1, -1]))
    assert metric.evaluate() == {}
    assert os.listdir(tmp_path) == ['detections_test-dev2017_d0_results.json']
    results = json.loads((tmp_path / 'detections_test-dev2017_d0_results.json').read_text())
    assert results == [
        {'image_id': 1, 'category_id': 17, 'bbox': [20, 10, 40, 20], 'score': pytest.approx(.9)},
        {'image_id': 2, 'category_id': 3, 'bbox': [0, 0, 5, 5], 'score': .5}]


def test_format_table_matches_pycocotools_summarize(tmp_path):
    metrics = evaluate(SCENE_IDS, SCENE_DETECTIONS, label_map=SCENE_LABEL_MAP,
                       val_json_file=write_scene_json(tmp_path))
    # pycocotools' own printout of the same evaluation, run independently.
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(str(tmp_path / 'instances_val.json'))
        results = [{'image_id': int(r[0]), 'category_id': SCENE_LABEL_MAP[int(r[6])],
                    'bbox': [r[2], r[1], r[4] - r[2], r[3] - r[1]], 'score': r[5]}
                   for r in SCENE_DETECTIONS.astype(float).tolist()]
        coco_eval = COCOeval(coco_gt, coco_gt.loadRes(results), 'bbox')
        coco_eval.params.imgIds = SCENE_IDS
        coco_eval.evaluate()
        coco_eval.accumulate()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        coco_eval.summarize()
    table = coco_metric.format_table(metrics).split('\n')
    assert table[:12] == printed.getvalue().splitlines()
    assert table[13:] == [f'   seven  {metrics["AP_/seven"]:0.3f}',
                          f'   four   {metrics["AP_/four"]:0.3f}']


def test_write_metrics_json_round_trips(tmp_path):
    metrics = {'AP': np.float64(0.25), 'AP50': 0.5, 'AP_/cat': float('nan'), 'AP_/dog': -1.0}
    path = coco_metric.write_metrics_json(metrics, str(tmp_path), step=1200)
    assert path == str(tmp_path / 'eval' / 'metrics-1200.json')
    assert sorted(os.listdir(tmp_path / 'eval')) == ['metrics-1200.json', 'metrics_latest.json']
    for name in ('metrics-1200.json', 'metrics_latest.json'):
        loaded = json.loads((tmp_path / 'eval' / name).read_text())
        assert loaded['step'] == 1200
        assert list(loaded['metrics'].items()) == [
            ('AP', 0.25), ('AP50', 0.5), ('AP_/cat', None), ('AP_/dog', -1.0)]


def test_reset_states_forgets_batches():
    metric = coco_metric.EvaluationMetric()
    gt = groundtruth([[(0, 0, 20, 20, 0, 1)]])
    metric.update_state([1], detections([1, 50, 50, 70, 70, .9, 1]), gt)
    assert metric.evaluate()['AP'] == 0.0
    metric.reset_states()
    metric.update_state([1], detections([1, 0, 0, 20, 20, .9, 1]), gt)
    assert metric.evaluate()['AP'] == pytest.approx(1.0)


@pytest.mark.parametrize('image_ids, dets, gt_images, message', [
    ([1], detections([2, 0, 0, 5, 5, .9, 1]), [[]], 'not passed as image_ids'),
    ([1, 1], detections(), [[], []], 'more than once'),
    ([1], detections(), [[(0, 0, 5, 5, 0, 3)]], 'not in the label map'),
    ([1], np.zeros([2, 6]), [[]], r'must be \[N, 7\]'),
])
def test_pipeline_mismatches_raise(image_ids, dets, gt_images, message):
    metric = coco_metric.EvaluationMetric(label_map={1: 1, 2: 2})
    with pytest.raises(ValueError, match=message):
        metric.update_state(image_ids, dets, groundtruth(gt_images))
        metric.evaluate()


def test_detections_of_labels_the_label_map_lacks_are_not_scored():
    # A class head wider than the data (automl's 90 COCO ids for 80 categories) predicts
    # labels no category has; they take no part, as in COCO's own scoring.
    gt = groundtruth([[(0, 0, 20, 20, 0, 1)]])
    metrics = evaluate([1], detections([1, 0, 0, 20, 20, .9, 1], [1, 0, 0, 20, 20, .95, 3]),
                       gt, label_map={1: 1, 2: 2})
    assert metrics['AP'] == pytest.approx(1.0)


def test_image_id_missing_from_json_raises(tmp_path):
    metric = coco_metric.EvaluationMetric(val_json_file=write_scene_json(tmp_path))
    metric.update_state([5, 77], detections())
    with pytest.raises(ValueError, match='not in --val_json_file'):
        metric.evaluate()


def test_class_without_groundtruth_reports_minus_one():
    gt = groundtruth([[(0, 0, 20, 20, 0, 1)]])
    metrics = evaluate([1], detections([1, 0, 0, 20, 20, .9, 1]), gt,
                       label_map={1: 1, 2: 2}, class_names={1: 'a', 2: 'b'})
    assert metrics['AP_/a'] == pytest.approx(1.0)
    assert metrics['AP_/b'] == -1.0
    assert not math.isnan(metrics['AP'])


def test_faster_coco_eval_gives_pycocotools_numbers(tmp_path):
    """The default evaluator (faster-coco-eval, pinned) against pycocotools, the referee, on
    a generated set with every kind of miss: the 12 stats and per-class AP to 1e-4."""
    from efficientdet_hpu.benchmarks import coco_eval_bench  # pylint: disable=import-outside-toplevel
    assert coco_metric.DEFAULT_EVALUATOR == 'faster_coco_eval'
    dataset, results = coco_eval_bench.generate(images=40, detections=30, classes=5)
    path = tmp_path / 'instances.json'
    path.write_text(json.dumps(dataset))
    rows = np.array([[r['image_id'], r['bbox'][1], r['bbox'][0], r['bbox'][1] + r['bbox'][3],
                      r['bbox'][0] + r['bbox'][2], r['score'], r['category_id']]
                     for r in results])
    scored = {}
    for evaluator in ('pycocotools', 'faster_coco_eval'):
        metric = coco_metric.EvaluationMetric(val_json_file=str(path), evaluator=evaluator)
        metric.update_state(np.arange(1, 41), rows)
        scored[evaluator] = metric.evaluate()
    assert list(scored['faster_coco_eval']) == list(scored['pycocotools'])
    assert scored['faster_coco_eval'] == pytest.approx(scored['pycocotools'], abs=1e-4)
    assert 0.05 < scored['pycocotools']['AP'] < 0.95  # Neither trivial nor perfect.
