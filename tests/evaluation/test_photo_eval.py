"""evaluation/photo_eval.py with photos the model found nothing on: scored (their boxes all
missed), not an error. The hand-made case of tests/data/test_tiling.py, one photo more."""
import json

import pytest

from efficientdet_hpu.evaluation import photo_eval


def test_a_predicted_photo_without_detections_is_scored_not_refused(tmp_path):
    """a.jpg: one tree found exactly (0.9); b.jpg: one tree, no detection. One of two trees
    found at precision 1: AP = AP50 = 51 / 101 (recall points 0..0.5), recall 0.5. With no
    detection at all, every box is missed: 0."""
    gt = tmp_path / 'photos.json'
    gt.write_text(json.dumps({
        'images': [{'id': 1, 'file_name': 'a.jpg', 'width': 100, 'height': 100},
                   {'id': 2, 'file_name': 'b.jpg', 'width': 100, 'height': 100}],
        'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10],
                         'area': 100, 'iscrowd': 0},
                        {'id': 2, 'image_id': 2, 'category_id': 1, 'bbox': [20, 20, 10, 10],
                         'area': 100, 'iscrowd': 0}],
        'categories': [{'id': 1, 'name': 'tree'}]}))
    rows = [{'image_id': 1, 'file_name': 'a.jpg', 'category_id': 1, 'bbox': [0, 0, 10, 10],
             'score': 0.9}]
    assert photo_eval.evaluate(rows, str(gt))['AP'] == pytest.approx(1.0)  # b.jpg not predicted.
    both = photo_eval.evaluate(rows, str(gt), photos=['a.jpg', 'b.jpg'])
    assert (both['photos'], both['annotations'], both['detections']) == (2, 2, 1)
    assert both['AP50'] == pytest.approx(51 / 101) and both['recall_iou0.4'] == 0.5
    nothing = photo_eval.evaluate([], str(gt), photos=['a.jpg', 'b.jpg'])
    assert nothing == {'photos': 2, 'annotations': 2, 'detections': 0, 'AP': 0.0, 'AP50': 0.0,
                       'recall_iou0.4': 0.0}
    with pytest.raises(photo_eval.PhotoEvalError, match='none of the predicted photos'):
        photo_eval.evaluate([], str(gt), photos=['other.jpg'])
