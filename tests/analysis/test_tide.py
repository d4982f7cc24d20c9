"""TIDE error analysis (analysis/tide.py) on a detection set worked out on paper, and against
the reference implementation `tidecv` on a random one.

TIDE facts the hand computation uses: AP is AP50 per class, precision made non-increasing from
the right and read at recall x/100 (x = 0..100) at the first point with recall >= x (0 past the
last), averaged; mAP averages the classes with ground truth (COCOeval's rule; tidecv also
averages in a class with detections only, at 0)."""
import numpy as np
import pytest

from coco_cases import tide_image
from efficientdet_hpu.analysis import tide

CAT, DOG = 1, 2
UNIT = [0, 0, 10, 10]      # xywh
THIN = [0, 0, 10, 3]       # IoU 30 / 100 = 0.3 with UNIT
FAR = [50, 50, 10, 10]     # IoU 0 with UNIT


def one_error_of_each_type():
    """Five images; each error type occurs exactly once.

    img1: A cat UNIT.  d1 cat .9 UNIT -> TP (A); d2 cat .8 UNIT -> duplicate (A taken);
          d6 cat .4 FAR -> background (IoU 0 <= 0.1).
    img2: B cat UNIT.  d3 dog .7 UNIT -> classification (IoU 1 with B of another class).
    img3: C cat UNIT.  d4 cat .6 THIN -> localisation (same-class IoU 0.3 in [0.1, 0.5]).
    img4: D dog UNIT.  d5 cat .5 THIN -> both (other-class IoU 0.3); d8 dog .2 UNIT -> TP (D).
    img5: E cat UNIT, F cat FAR.  d7 cat .3 UNIT -> TP (E); F -> missed.
    """
    return [tide_image([(UNIT, CAT, 0)], [(UNIT, CAT, .9), (UNIT, CAT, .8), (FAR, CAT, .4)]),
            tide_image([(UNIT, CAT, 0)], [(UNIT, DOG, .7)]),
            tide_image([(UNIT, CAT, 0)], [(THIN, CAT, .6)]),
            tide_image([(UNIT, DOG, 0)], [(THIN, CAT, .5), (UNIT, DOG, .2)]),
            tide_image([(UNIT, CAT, 0), (FAR, CAT, 0)], [(UNIT, CAT, .3)])]


def test_one_error_of_each_type_worked_out_on_paper():
    """Cat: 5 truths; by score d1 T, d2 F, d4 F, d5 F, d6 F, d7 T: recall .2 x5 then .4,
    precision 1, .5, 1/3, .25, .2, 1/3 -> smoothed 1, .5, 1/3, 1/3, 1/3, 1/3:
    21 points (x <= .20) read 1, 20 (x .21-.40) read 1/3: AP = (21 + 20/3) / 101 = 83/303.
    Dog: 1 truth; d3 F .7, d8 T .2: precision 0, .5 -> .5, .5; AP = 1/2.
    mAP = (83/303 + 1/2) / 2 = 469/1212.
    Fix classification: d3 -> cat TP .7; dog keeps d8 only (AP 1); cat T F T F F F T, recall
      .2 .2 .4 .4 .4 .4 .6, smoothed 1 2/3 2/3 .5 3/7 3/7 3/7: (21 + 20*2/3 + 20*3/7) / 101
      = 901/2121; mAP = (901/2121 + 1)/2 = 1511/2121; dAP = 1511/2121 - 469/1212 = 2761/8484.
    Fix localisation: d4 -> cat TP .6: T F T F F T, smoothed 1 2/3 2/3 .5 .5 .5:
      (21 + 40/3 + 10)/101 = 133/303; mAP = 569/1212; dAP = 100/1212.
    Fix both, duplicate or background: one false positive above d7 leaves (d1 T and four
      more, then d7 T) precision at recall .4 of 2/5: (21 + 8)/101 = 87/303; dAP = 8/1212.
    Fix missed: F leaves the count (4 cats): 26 points read 1, 25 read 1/3: 103/303;
      mAP = 509/1212; dAP = 40/1212.
    False positives (TPs scored 1, FPs 0): cat 41/101, dog 1: dAP = 71/101 - 469/1212 = 383/1212.
    False negatives (B, C, F leave the count: 2 cats): (51 + 50/3)/101 = 203/303;
      dAP = 709/1212 - 469/1212 = 240/1212."""
    truths, dets = zip(*one_error_of_each_type())
    result = tide.analyse(list(truths), list(dets))
    assert result.ap == pytest.approx(469 / 1212, rel=1e-12)
    assert result.class_ap == pytest.approx({CAT: 83 / 303, DOG: 0.5}, rel=1e-12)
    assert result.counts == {kind: 1 for kind in tide.ERROR_TYPES}
    expected = {'classification': 2761 / 8484, 'localisation': 100 / 1212, 'both': 8 / 1212,
                'duplicate': 8 / 1212, 'background': 8 / 1212, 'missed': 40 / 1212,
                'false_positives': 383 / 1212, 'false_negatives': 240 / 1212}
    assert result.delta == pytest.approx(expected, rel=1e-12)
    # Which detection got which type (in score order within each image), and the truths.
    assert [outcome.det_kind for outcome in result.images] == [
        ['tp', 'duplicate', 'background'], ['classification'], ['localisation'],
        ['both', 'tp'], ['tp']]
    assert [outcome.truth_kind for outcome in result.images] == [
        ['tp'], ['fixable'], ['fixable'], ['tp'], ['tp', 'missed']]
    assert result.class_counts[DOG] == dict({kind: 0 for kind in tide.ERROR_TYPES},
                                            classification=1)


def test_a_crowd_region_hides_its_false_positive_and_only_the_best_fix_counts():
    """Two cat detections at IoU 0.3 with one cat truth: both localisation errors, one truth:
    fixing them turns only the higher-scored one (.8) into a TP and drops the other.
    A third detection inside a cat crowd box is ignored: not in the AP (TIDE still files it
    under a type, background here, as tidecv does). AP: T (.8) then nothing: 1 truth -> AP 1 after the fix; before it
    the truth is unmatched and the two FPs give AP 0."""
    truth, dets = tide_image([(UNIT, CAT, 0), ([50, 50, 20, 20], CAT, 1)],
                        [(THIN, CAT, .8), ([0, 7, 10, 3], CAT, .6), ([55, 55, 5, 5], CAT, .7)])
    result = tide.analyse([truth], [dets])
    assert result.ap == 0.0
    assert result.images[0].det_kind == ['localisation', 'ignored', 'localisation']
    assert result.delta['localisation'] == pytest.approx(1.0)
    assert result.counts['missed'] == 0  # The truth is fixable, not missed.


def random_set(seed, images=60):
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(images):
        count, found = rng.integers(0, 6), rng.integers(0, 12)
        truth_boxes = np.c_[rng.uniform(0, 80, (count, 2)), rng.uniform(5, 40, (count, 2))]
        truth_classes = rng.integers(1, 4, count)
        boxes = np.c_[rng.uniform(0, 80, (found, 2)), rng.uniform(5, 40, (found, 2))]
        classes = rng.integers(1, 4, found)
        if count:
            source = rng.integers(0, count, found)
            near = rng.random(found) < 0.7
            boxes[near] = truth_boxes[source[near]] + rng.normal(0, 4, (int(near.sum()), 4))
            boxes[:, 2:] = np.maximum(boxes[:, 2:], 1)
            classes = np.where(rng.random(found) < 0.8, truth_classes[source], classes)
        sets.append((tide.ImageTruth(truth_boxes, truth_classes.astype(np.int64),
                                     rng.random(count) < 0.1),
                     tide.ImageDetections(boxes, classes.astype(np.int64), rng.random(found))))
    return sets


def test_matches_tidecv_on_random_detections():
    import tidecv  # pylint: disable=import-outside-toplevel  (pinned in requirements.txt)
    sets = random_set(0)
    truth_data, prediction_data = tidecv.Data('gt'), tidecv.Data('dets')
    for image_id, (truth, dets) in enumerate(sets):
        truth_data.add_image(image_id, str(image_id))
        for box, cls, crowd in zip(truth.boxes.tolist(), truth.classes.tolist(),
                                   truth.crowd.tolist()):
            add = truth_data.add_ignore_region if crowd else truth_data.add_ground_truth
            add(image_id, cls, box, None)
        for box, cls, score in zip(dets.boxes.tolist(), dets.classes.tolist(),
                                   dets.scores.tolist()):
            prediction_data.add_detection(image_id, cls, score, box, None)
    run = tidecv.TIDE().evaluate(truth_data, prediction_data, mode=tidecv.TIDE.BOX)
    reference = {error.short_name: value for error, value in
                 list(run.fix_main_errors().items()) + list(run.fix_special_errors().items())}
    counts = {error.short_name: len(found) for error, found in run.error_dict.items()}
    result = tide.analyse(*map(list, zip(*sets)))
    assert result.ap * 100 == pytest.approx(run.ap, rel=1e-9)
    for kind, short in tide.SHORT_NAMES.items():
        assert result.delta[kind] * 100 == pytest.approx(reference[short], rel=1e-9, abs=1e-9)
        if kind in tide.ERROR_TYPES:
            assert result.counts[kind] == counts[short], kind
    assert min(result.counts.values()) > 0  # Every type occurs, so every branch is compared.


def test_a_class_without_ground_truth_is_left_out_not_scored_zero():
    """deepforest's case: validation photos of cats only, the model also predicts dogs. The
    cat is found (AP 1); the dog detection has no dog truth to be scored against: COCOeval
    gives dog AP -1 and leaves it out, tidecv scores it 0 and halves the mean. Here: AP 1, the
    dog listed as unscored, its detection still a background error, and no dAP from it."""
    import tidecv  # pylint: disable=import-outside-toplevel  (pinned in requirements.txt)
    truth, dets = tide_image([(UNIT, CAT, 0)], [(UNIT, CAT, .9), (FAR, DOG, .8)])
    result = tide.analyse([truth], [dets])
    assert result.ap == 1.0 and result.class_ap == {CAT: 1.0}
    assert result.unscored == [DOG]
    assert result.counts['background'] == 1
    assert result.delta['background'] == 0.0 and result.delta['false_positives'] == 0.0
    truth_data, prediction_data = tidecv.Data('gt'), tidecv.Data('dets')
    truth_data.add_image(0, '0')
    truth_data.add_ground_truth(0, CAT, UNIT, None)
    prediction_data.add_detection(0, CAT, .9, UNIT, None)
    prediction_data.add_detection(0, DOG, .8, FAR, None)
    run = tidecv.TIDE().evaluate(truth_data, prediction_data, mode=tidecv.TIDE.BOX)
    assert run.ap == pytest.approx(50.0)  # The convention this module leaves.
