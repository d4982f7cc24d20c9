"""review/scores.py, the adapter to cleanlab: the project's boxes and classes in cleanlab's
format, the calibration of EfficientDet's scores onto cleanlab's probability scale, and the
scores read back equal to cleanlab's own functions called on the same input (the referee)."""
import numpy as np
import pytest
from cleanlab.object_detection import rank

from efficientdet_hpu.review import scores as scores_lib

CATEGORIES = [{'id': 9, 'name': 'dog'}, {'id': 4, 'name': 'cat'}]  # cat is class 0 (id 4).
CLASS_OF = {4: 0, 9: 1}


def ann(id_, category_id, x1, y1, x2, y2, **extra):
    return dict({'id': id_, 'image_id': 1, 'category_id': category_id,
                 'bbox': [x1, y1, x2 - x1, y2 - y1], 'iscrowd': 0}, **extra)


def det(category_id, x1, y1, x2, y2, score):
    return {'category_id': category_id, 'bbox': [x1, y1, x2 - x1, y2 - y1], 'score': score}


def test_boxes_and_classes_in_cleanlab_format():
    assert scores_lib.classes({'categories': CATEGORIES}) == [4, 9]
    labels = scores_lib.to_labels([ann(1, 9, 10, 20, 30, 60), ann(2, 4, 0, 0, 5, 5, iscrowd=1),
                                   ann(3, 4, 1, 2, 3, 4)], CLASS_OF, 'a.jpg')
    assert labels['bboxes'].tolist() == [[10, 20, 30, 60], [1, 2, 3, 4]]  # The crowd left out.
    assert labels['labels'].tolist() == [1, 0] and labels['image_name'] == 'a.jpg'
    found = scores_lib.to_predictions([det(4, 0, 0, 10, 10, 0.5), det(9, 5, 5, 8, 9, 0.25),
                                       det(77, 0, 0, 1, 1, 0.9)], CLASS_OF, lambda s: 2 * s)
    assert [boxes.tolist() for boxes in found] == [[[0, 0, 10, 10, 1.0]], [[5, 5, 8, 9, 0.5]]]


def test_matched_scores_take_each_label_once_by_score_and_class():
    labels = scores_lib.to_labels([ann(1, 4, 0, 0, 10, 10), ann(2, 9, 50, 50, 60, 60)],
                                  CLASS_OF, 'a')
    rows = [det(4, 0, 0, 10, 10, 0.3), det(4, 0, 0, 10, 10, 0.8),  # Same label twice: 0.8 wins.
            det(4, 50, 50, 60, 60, 0.9),  # The dog's place, as a cat: no match.
            det(9, 51, 50, 61, 60, 0.7)]  # IoU 90 / 110 = 0.82 with the dog: a match.
    assert sorted(scores_lib.matched_scores([(labels, rows, CLASS_OF)]).tolist()) == [0.7, 0.8]


def test_the_calibration_puts_the_matched_scores_on_cleanlabs_scale():
    matched = np.linspace(0.05, 1.0, 20)  # 0.05, 0.10, ..., 1.0
    probability, (plausible, confident) = scores_lib.calibrated_scores(matched)
    # 95% of the matched at or above the 5% quantile, 90% above the 10% quantile.
    assert plausible == pytest.approx(np.quantile(matched, 0.05))
    assert confident == pytest.approx(np.quantile(matched, 0.1))
    assert probability(plausible) == pytest.approx(0.5)
    assert probability(confident) == pytest.approx(0.95)
    assert probability(0.0) == 0.0 and probability(1.0) == 1.0
    values = [probability(s) for s in np.linspace(0, 1, 101)]
    assert all(b >= a for a, b in zip(values, values[1:]))  # The order of the scores is kept.
    identity, _ = scores_lib.calibrated_scores(np.array([]))
    assert identity(0.37) == 0.37


def _case():
    """A photo with a correct cat, a dog the model calls a cat, a cat box shifted to IoU 0.6
    with the model's, and an unlabelled dog the model finds."""
    labels = [scores_lib.to_labels([ann(1, 4, 10, 10, 50, 50), ann(2, 9, 100, 100, 140, 140),
                                    ann(3, 4, 200, 10, 240, 50)], CLASS_OF, 'a.jpg'),
              scores_lib.to_labels([ann(4, 9, 10, 10, 50, 50)], CLASS_OF, 'b.jpg')]
    predictions = [scores_lib.to_predictions(
        [det(4, 10, 10, 50, 50, 0.99), det(4, 100, 100, 140, 140, 0.98),
         det(9, 300, 300, 340, 340, 0.97), det(4, 210, 10, 250, 50, 0.9)], CLASS_OF,
        lambda s: s),
        scores_lib.to_predictions([det(9, 11, 10, 50, 50, 0.99)], CLASS_OF, lambda s: s)]
    return labels, predictions


def test_the_scores_are_cleanlabs_own():
    labels, predictions = _case()
    results = scores_lib.score(labels, predictions, cover_iou=0.0)  # cleanlab's rule.
    for kind, function in (('swap', rank.compute_swap_box_scores),
                           ('badloc', rank.compute_badloc_box_scores)):
        referee = function(labels=labels, predictions=predictions)
        for result, expected in zip(results, referee):
            assert [row[kind] for row in result['labels']] == pytest.approx(expected.tolist())
    overlooked = rank.compute_overlooked_box_scores(labels=labels, predictions=predictions)
    assert [row['score'] for row in results[0]['overlooked']] == pytest.approx(
        [value for value in overlooked[0] if not np.isnan(value)])
    assert [r['image'] for r in results] == pytest.approx(
        rank.get_label_quality_scores(labels, predictions, verbose=False).tolist())


def test_each_kind_names_the_label_and_the_models_box():
    labels, predictions = _case()
    first = scores_lib.score(labels, predictions)[0]
    cat, dog, shifted = first['labels']
    assert dog['swap'] < 0.5 and dog['suggested_class'] == 0  # The model sees a cat.
    assert dog['swap_box'] == [100, 100, 140, 140]
    # The cat is compared with the one confident dog, far away: nothing like a swap.
    assert cat['swap'] > 0.99 and cat['swap_box'] == [300, 300, 340, 340]
    assert shifted['badloc'] < cat['badloc'] and shifted['badloc_box'] == [210, 10, 250, 50]
    (missing,) = first['overlooked']
    assert missing['class'] == 1 and missing['box'] == [300, 300, 340, 340]
    assert first['image'] < scores_lib.score(labels, predictions)[1]['image']


def test_a_label_covers_a_prediction_from_cover_iou():
    """A confident dog touching a labelled dog by IoU 0.026 is a candidate for `overlooked`
    with a cover IoU of 0.2, not under cleanlab's rule (any overlap); a confident cat on the
    labelled cat by IoU 0.6 is not; the candidate's score is cleanlab's, its similarity to the
    closest labelled dog, and cleanlab's own function keeps its rule once scored."""
    labels = [{'bboxes': np.array([[0, 0, 40, 40], [100, 0, 140, 40]], np.float64),
               'labels': np.array([1, 0])}]
    touching = [38, 0, 78, 40]  # IoU with the dog 2 x 40 / (3,200 - 80) = 0.026.
    shifted = [90, 0, 130, 40]  # IoU 30 x 40 / (3,200 - 1,200) = 0.6 with the cat.
    predictions = [[np.array([shifted + [0.99]]), np.array([touching + [0.99]])]]
    (cleanlabs,) = scores_lib.score(labels, predictions, cover_iou=0.0)
    assert cleanlabs['overlooked'] == []
    (relaxed,) = scores_lib.score(labels, predictions, cover_iou=0.2)
    (row,) = relaxed['overlooked']
    assert row['box'] == touching and row['class'] == 1
    aux = rank._get_valid_inputs_for_compute_scores(rank.ALPHA, labels, predictions)[0]
    dog_prediction = int(np.where(aux['pred_labels'] == 1)[0][0])
    assert row['score'] == pytest.approx(aux['similarity_matrix'][0, dog_prediction])
    assert rank.compute_overlooked_box_scores(labels=labels, predictions=predictions)[0] \
        == pytest.approx([np.nan, np.nan], nan_ok=True)
    # The photo's score pools the new candidate: lower than under cleanlab's rule.
    assert relaxed['image'] < cleanlabs['image']
