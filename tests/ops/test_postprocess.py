"""NMS and detection rows on hand-placed boxes.

Every case uses zero box codes, so each decoded box is exactly its anchor, and one
level laid out as a 1 x K grid with one anchor per location.
"""

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.ops import postprocess

NUM_CLASSES = 2
_OFF = -30.0  # logit of "not this class": sigmoid ~ 1e-13, far below any threshold


def _logit(p):
    return float(np.log(p / (1.0 - p)))


def _outputs(per_image):
    """per_image: list over the batch of [(class_index, score), ...] per anchor."""
    logits = np.full((len(per_image), 1, len(per_image[0]), NUM_CLASSES), _OFF, np.float32)
    for b, anchors in enumerate(per_image):
        for a, (cls, score) in enumerate(anchors):
            logits[b, 0, a, cls] = _logit(score)
    codes = np.zeros(logits.shape[:3] + (4,), np.float32)
    return {3: tf.constant(logits)}, {3: tf.constant(codes)}


def _detect(boxes, per_image, image_ids=None, scales=None, sizes=None, **kwargs):
    class_outputs, box_outputs = _outputs(per_image)
    batch = len(per_image)
    image_ids = tf.constant(image_ids or [7] * batch, tf.int64)
    scales = tf.constant(scales or [1.0] * batch, tf.float32)
    sizes = None if sizes is None else tf.constant(sizes, tf.int32)
    kwargs.setdefault('max_output_size', 5)
    rows, count = postprocess.generate_detections(
        class_outputs, box_outputs, np.array(boxes, np.float32), image_ids, scales, sizes,
        num_classes=NUM_CLASSES, **kwargs)
    return rows.numpy(), count.numpy()


# Class 0 cluster: B0 and B1 overlap with IoU 81 / 119 = 0.68.
# Class 1 cluster: B2 and B3 overlap with IoU 80 / 120 = 0.67.
# B4 is alone. Scores all distinct.
FIVE_BOXES = [[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [50, 52, 60, 62],
              [80, 80, 90, 95]]
FIVE_SCORES = [(0, 0.9), (0, 0.8), (1, 0.7), (1, 0.6), (1, 0.65)]


def test_hard_nms_on_five_boxes():
    rows, count = _detect(FIVE_BOXES, [FIVE_SCORES])
    assert rows.shape == (1, 5, 7) and rows.dtype == np.float32
    assert count.tolist() == [3]
    expected = np.array([[7, 0, 0, 10, 10, 0.9, 1],     # B0, label = class 0 + 1
                         [7, 50, 50, 60, 60, 0.7, 2],   # B2 beats B3
                         [7, 80, 80, 90, 95, 0.65, 2],  # B4 alone
                         [0] * 7, [0] * 7], np.float32)
    np.testing.assert_allclose(rows[0], expected, rtol=1e-5)
    np.testing.assert_array_equal(rows[0, 3:], 0.0)


def test_nms_is_per_class():
    # Two identical boxes of different classes both survive.
    rows, count = _detect([[0, 0, 10, 10], [0, 0, 10, 10]], [[(0, 0.9), (1, 0.8)]])
    assert count.tolist() == [2]
    np.testing.assert_allclose(rows[0, :2, 5:], [[0.9, 1], [0.8, 2]], rtol=1e-5)


def test_all_nms_inputs_matches_top_k_preselection():
    top_k_rows, _ = _detect(FIVE_BOXES, [FIVE_SCORES])
    all_rows, _ = _detect(FIVE_BOXES, [FIVE_SCORES], max_nms_inputs=0)
    np.testing.assert_allclose(all_rows, top_k_rows, rtol=1e-6)
    # Pre-selecting only the 2 best (anchor, class) pairs leaves B0 (B1 is suppressed).
    rows, count = _detect(FIVE_BOXES, [FIVE_SCORES], max_nms_inputs=2)
    assert count.tolist() == [1]
    np.testing.assert_allclose(rows[0, 0], [7, 0, 0, 10, 10, 0.9, 1], rtol=1e-5)


def test_gaussian_soft_nms_decays_overlapping_score():
    # IoU of the two boxes = 50 / 150 = 1/3; sigma = 0.5.
    rows, count = _detect([[0, 0, 10, 10], [0, 5, 10, 15]], [[(0, 0.9), (0, 0.8)]],
                          method='gaussian', sigma=0.5)
    assert count.tolist() == [2]
    decayed = 0.8 * np.exp(-(1 / 3) ** 2 / 0.5)
    np.testing.assert_allclose(rows[0, :2], [[7, 0, 0, 10, 10, 0.9, 1],
                                             [7, 0, 5, 10, 15, decayed, 1]], rtol=1e-5)


def test_score_threshold():
    rows, count = _detect([[0, 0, 10, 10], [20, 20, 30, 30]], [[(0, 0.9), (1, 0.3)]],
                          score_thresh=0.5)
    assert count.tolist() == [1]
    np.testing.assert_array_equal(rows[0, 1:], 0.0)


def test_max_output_size_caps_detections():
    boxes = [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50], [60, 60, 70, 70]]
    rows, count = _detect(boxes, [[(0, 0.5), (1, 0.9), (0, 0.7), (1, 0.6)]],
                          max_output_size=2)
    assert rows.shape == (1, 2, 7) and count.tolist() == [2]
    np.testing.assert_allclose(rows[0, :, 1:], [[20, 20, 30, 30, 0.9, 2],
                                                [40, 40, 50, 50, 0.7, 1]], rtol=1e-5)


def test_scales_and_clips_to_original_pixels_per_image():
    boxes = [[10, 20, 30, 80], [0, 0, 4, 4]]
    per_image = [[(0, 0.9), (1, 0.05)], [(0, 0.9), (1, 0.05)]]
    rows, count = _detect(boxes, per_image, image_ids=[7, 8], scales=[2.0, 0.5],
                          sizes=[[50, 100], [100, 100]])
    assert count.tolist() == [2, 2]
    # Image 7: x2 -> [20, 40, 60, 160], clipped to 50 x 100 -> [20, 40, 50, 100].
    np.testing.assert_allclose(rows[0, :2], [[7, 20, 40, 50, 100, 0.9, 1],
                                             [7, 0, 0, 8, 8, 0.05, 2]], rtol=1e-5)
    # Image 8: x0.5 -> [5, 10, 15, 40], inside 100 x 100.
    np.testing.assert_allclose(rows[1, :2], [[8, 5, 10, 15, 40, 0.9, 1],
                                             [8, 0, 0, 2, 2, 0.05, 2]], rtol=1e-5)


def test_runs_in_v1_graph_with_unknown_batch():
    class_outputs, box_outputs = _outputs([FIVE_SCORES])
    feed_logits, feed_codes = class_outputs[3].numpy(), box_outputs[3].numpy()
    with tf.Graph().as_default():
        logits = tf.compat.v1.placeholder(tf.float32, [None, 1, 5, NUM_CLASSES])
        codes = tf.compat.v1.placeholder(tf.float32, [None, 1, 5, 4])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        scales = tf.compat.v1.placeholder(tf.float32, [None])
        rows, count = postprocess.generate_detections(
            {3: logits}, {3: codes}, np.array(FIVE_BOXES, np.float32), ids, scales,
            num_classes=NUM_CLASSES, max_output_size=5)
        with tf.compat.v1.Session() as sess:
            got_rows, got_count = sess.run([rows, count], {
                logits: feed_logits, codes: feed_codes, ids: [7], scales: [1.0]})
    eager_rows, _ = _detect(FIVE_BOXES, [FIVE_SCORES])
    assert got_count.tolist() == [3]
    np.testing.assert_allclose(got_rows, eager_rows, rtol=1e-6)


def test_unknown_method_lists_valid_ones():
    with pytest.raises(ValueError, match='gaussian'):
        _detect(FIVE_BOXES, [FIVE_SCORES], method='linear')


def _brute_force_detections(logits, codes, anchor_boxes, k, iou_thresh, max_output_size):
    """One image: top-k of all (anchor, class) pairs by a full sort, then greedy class-aware
    NMS in one global order (host_postprocess.nms), boxes decoded in NumPy."""
    num_classes = logits.shape[1]
    pairs = np.argsort(-logits.reshape(-1), kind='stable')[:k]
    anchor_index, class_index = pairs // num_classes, pairs % num_classes
    boxes = host_postprocess.decode_boxes(codes[anchor_index].astype(np.float64),
                                          anchor_boxes[anchor_index])
    scores = host_postprocess.sigmoid(logits.reshape(-1)[pairs].astype(np.float64))
    kept = host_postprocess.nms(boxes, scores, iou_thresh, max_output_size,
                                classes=class_index)
    return boxes[kept], scores[kept], class_index[kept] + 1


@pytest.mark.parametrize('num_classes,k', [(6, 60), (90, 500), (3, 10_000)])
def test_matches_brute_force_top_k_and_per_class_nms(num_classes, k):
    # 3 levels of a 64 px image, 9 anchors a location: many overlapping boxes per class.
    anchor_boxes = anchors.generate_anchor_boxes(64, 64, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    num_anchors = len(anchor_boxes)
    rng = np.random.default_rng(num_classes)
    logits = rng.normal(-2.0, 2.0, [2, num_anchors, num_classes]).astype(np.float32)
    codes = rng.normal(0.0, 0.2, [2, num_anchors, 4]).astype(np.float32)
    rows, counts = postprocess.generate_detections(
        {3: logits.reshape(2, 1, num_anchors, num_classes)},
        {3: codes.reshape(2, 1, num_anchors, 4)}, anchor_boxes, tf.constant([1, 2]),
        tf.ones([2]), num_classes=num_classes, iou_thresh=0.5, score_thresh=0.0,
        max_nms_inputs=k, max_output_size=40)
    for image in range(2):
        boxes, scores, labels = _brute_force_detections(
            logits[image], codes[image], anchor_boxes, k, 0.5, 40)
        assert int(counts[image]) == len(scores) == 40
        got = rows.numpy()[image]
        np.testing.assert_allclose(got[:, 5], scores, rtol=1e-5)
        np.testing.assert_allclose(got[:, 1:5], boxes, atol=1e-3)
        assert got[:, 6].astype(int).tolist() == labels.tolist()


@pytest.mark.parametrize('k', [0, 1, 7, 40, 10_000])
def test_host_top_pairs_are_the_k_best_pairs(k):
    logits = np.random.default_rng(k).normal(size=[50, 8])
    expected = np.argsort(-logits.reshape(-1))[:k or None]
    assert sorted(host_postprocess.top_pairs(logits, k).tolist()) == sorted(expected.tolist())


def test_degenerate_huge_box_does_not_merge_classes():
    # A box decoding to infinite size is clamped for NMS only; the identical small boxes of two
    # classes still both survive, and the huge one is kept (clipped to the image).
    class_outputs = {3: tf.constant(np.array(
        [[[[_logit(0.9), _OFF], [_OFF, _logit(0.8)], [_logit(0.7), _OFF]]]], np.float32))}
    codes = np.zeros([1, 1, 3, 4], np.float32)
    codes[0, 0, 2, 2:] = 100.0  # exp(100) overflows float32: an infinite box
    rows, count = postprocess.generate_detections(
        class_outputs, {3: tf.constant(codes)},
        np.array([[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30]], np.float32),
        tf.constant([7]), tf.ones([1]), tf.constant([[64, 64]]), num_classes=NUM_CLASSES,
        max_output_size=5)
    assert count.numpy().tolist() == [3]
    np.testing.assert_allclose(rows.numpy()[0, :3], [[7, 0, 0, 10, 10, 0.9, 1],
                                             [7, 0, 0, 10, 10, 0.8, 2],
                                             [7, 0, 0, 64, 64, 0.7, 1]], rtol=1e-5)


# google/automl's two paths (efficientdet/tf2/postprocess.py), on the hand-placed boxes.

def test_best_class_per_anchor_when_max_nms_inputs_is_0():
    # One anchor scores 0.9 as class 0 and 0.8 as class 1: only its best class is a candidate
    # (automl's pre_nms), while the 5 best pairs keep both.
    logits = np.full((1, 1, 2, NUM_CLASSES), _OFF, np.float32)
    logits[0, 0, 0] = [_logit(0.9), _logit(0.8)]
    logits[0, 0, 1, 1] = _logit(0.3)
    codes = tf.zeros([1, 1, 2, 4])
    boxes = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32)
    for k, expected in ((0, [[0.9, 1], [0.3, 2]]), (5, [[0.9, 1], [0.8, 2], [0.3, 2]])):
        rows, count = postprocess.generate_detections(
            {3: tf.constant(logits)}, {3: codes}, boxes, tf.constant([7]), tf.ones([1]),
            num_classes=NUM_CLASSES, max_nms_inputs=k, max_output_size=5)
        assert count.numpy().tolist() == [len(expected)]
        np.testing.assert_allclose(rows.numpy()[0, :len(expected), 5:], expected, rtol=1e-5)


def test_class_agnostic_nms_suppresses_across_classes_and_clips_to_the_network_input():
    # B2 (class 1, 0.7) and B3 (class 1, 0.6) overlap; B0 / B1 (class 0) too. Per class the
    # five boxes leave three; class-agnostic, the same three here. Two identical boxes of two
    # classes: per class both stay, class-agnostic only the better one.
    rows, count = _detect([[0, 0, 10, 10], [0, 0, 10, 10]], [[(0, 0.9), (1, 0.8)]],
                          class_agnostic=True, network_size=(8, 16))
    assert count.tolist() == [1]
    # Clipped to the 8 x 16 network input before scaling, as automl's postprocess_global.
    np.testing.assert_allclose(rows[0, 0], [7, 0, 0, 8, 10, 0.9, 1], rtol=1e-5)
    rows, count = _detect(FIVE_BOXES, [FIVE_SCORES], class_agnostic=True, network_size=(100, 100))
    assert count.tolist() == [3]
    np.testing.assert_allclose(rows[0, :3, 5], [0.9, 0.7, 0.65], rtol=1e-5)


def test_class_agnostic_gaussian_decays_across_classes():
    # IoU 1/3 across classes: class-agnostic soft-NMS decays the second, per class it does not.
    boxes, scores = [[0, 0, 10, 10], [0, 5, 10, 15]], [[(0, 0.9), (1, 0.8)]]
    decayed = 0.8 * np.exp(-(1 / 3) ** 2 / 0.5)
    for class_agnostic, second in ((True, decayed), (False, 0.8)):
        rows, _ = _detect(boxes, scores, method='gaussian', sigma=0.5,
                          class_agnostic=class_agnostic, network_size=(100, 100))
        np.testing.assert_allclose(rows[0, :2, 5], [0.9, second], rtol=1e-5)


def test_a_box_wholly_outside_the_photo_is_dropped_the_rest_move_up():
    # A 100 x 60 photo in a 100 x 100 network input (scale 1): x 60-100 is the input's
    # padding. The best-scoring box lies in it: clipped, it keeps no area, so it is dropped
    # and the rows after it move up; a box across the photo's edge is kept, clipped.
    boxes = [[10, 70, 30, 90], [10, 10, 30, 30], [40, 50, 60, 80], [70, 65, 90, 99]]
    per_image = [[(0, 0.95), (1, 0.9), (0, 0.8), (1, 0.7)]]
    rows, count = _detect(boxes, per_image, sizes=[[100, 60]])
    assert count.tolist() == [2]
    np.testing.assert_allclose(rows[0], [[7, 10, 10, 30, 30, 0.9, 2],
                                         [7, 40, 50, 60, 60, 0.8, 1],
                                         [0] * 7, [0] * 7, [0] * 7], rtol=1e-5)
    logits = _outputs(per_image)[0][3].numpy().reshape(1, 4, NUM_CLASSES)
    host = host_postprocess.generate_detections(
        logits, np.zeros((1, 4, 4), np.float32), np.array(boxes, np.float32), [1.0],
        [[100, 60]], method='hard', iou_thresh=0.5, score_thresh=0.001, sigma=0.5,
        max_nms_inputs=5000, max_output_size=5)[0]
    np.testing.assert_allclose(host[0], rows[0, :2, 1:5], rtol=1e-5)
    assert host[2].tolist() == [2, 1]
    # Not clipped (automl's paths), nothing is dropped.
    _, count = _detect(boxes, per_image, sizes=[[100, 60]], clip_to_image=False)
    assert count.tolist() == [4]


def test_boxes_are_not_clipped_to_the_image_when_asked():
    # automl's paths do not clip to the original image: a box past it stays as decoded.
    rows, _ = _detect([[10, 20, 30, 80]], [[(0, 0.9)]], scales=[2.0], sizes=[[50, 100]],
                      clip_to_image=False)
    np.testing.assert_allclose(rows[0, 0, 1:5], [20, 40, 60, 160], rtol=1e-6)


@pytest.mark.parametrize('method, class_agnostic, k', [
    ('gaussian', False, 0), ('gaussian', True, 0), ('gaussian', False, 300), ('hard', True, 0)])
def test_host_postprocess_matches_the_graph_on_every_path(method, class_agnostic, k):
    anchor_boxes = anchors.generate_anchor_boxes(64, 64, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    rng = np.random.default_rng(3)
    logits = rng.normal(-3.0, 2.0, [1, len(anchor_boxes), 5]).astype(np.float32)
    codes = rng.normal(0.0, 0.2, [1, len(anchor_boxes), 4]).astype(np.float32)
    settings = dict(method=method, class_agnostic=class_agnostic, max_nms_inputs=k,
                    iou_thresh=0.5, score_thresh=0.01, sigma=0.5, max_output_size=30)
    rows, count = postprocess.generate_detections(
        {3: logits[:, None]}, {3: codes[:, None]}, anchor_boxes, tf.constant([1]),
        tf.constant([1.5]), tf.constant([[90, 80]]), num_classes=5, network_size=(64, 64),
        **settings)
    boxes, scores, labels = host_postprocess.generate_detections(
        logits, codes, anchor_boxes, [1.5], [[90, 80]], network_size=(64, 64), **settings)[0]
    got = rows.numpy()[0, :int(count[0])]
    assert len(got) == len(scores) > 20  # Of 30: those wholly past the 80 px width dropped.
    np.testing.assert_allclose(got[:, 5], scores, rtol=1e-5)
    np.testing.assert_allclose(got[:, 1:5], boxes, atol=1e-3)
    assert got[:, 6].astype(int).tolist() == labels.tolist()
