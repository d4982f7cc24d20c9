"""Anchor tables worked out by hand, and target assignment on hand-placed boxes."""

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.ops import anchors

S2 = np.sqrt(2.0)


def _f32(rows):
    return np.array(rows, dtype=np.float64).astype(np.float32)


# 64x64 image, level 5 only: stride 32, a 2x2 grid with centres y, x in {16, 48}.
# anchor_scale 1 -> octave-0 base size 32.
#   ratio 1.0: 32 x 32                    -> half (h, w) = (16, 16)
#   ratio 2.0: w = 32*sqrt2, h = 32/sqrt2  -> half (h, w) = (8*sqrt2, 16*sqrt2)
# octave 1 (num_scales=2): base 32*2**(1/2) = 32*sqrt2
#   ratio 1.0: half (h, w) = (16*sqrt2, 16*sqrt2)
#   ratio 2.0: w = 32*sqrt2*sqrt2 = 64, h = 32*sqrt2/sqrt2 = 32 -> half (16, 32)
def _box(cy, cx, half_h, half_w):
    return [cy - half_h, cx - half_w, cy + half_h, cx + half_w]


def test_level_shapes():
    assert anchors.level_shapes(64, 128, 4, 5) == {4: (4, 8), 5: (2, 4)}
    with pytest.raises(ValueError, match='multiple of 2\\*\\*min\\(max_level, 5\\) = 32'):
        anchors.level_shapes(100, 64, 3, 5)


def test_level_shapes_above_level_5_round_up_as_automl():
    # EfficientDet-Lite0 at 320: 320 / 32 = 10 at level 5, then ceil(10/2) = 5, ceil(5/2) = 3
    # (automl's get_feat_sizes); Lite2 at 448: 14, 7, 4.
    assert anchors.level_shapes(320, 320, 3, 7) == {3: (40, 40), 4: (20, 20), 5: (10, 10),
                                                    6: (5, 5), 7: (3, 3)}
    assert anchors.level_shapes(448, 320, 6, 7) == {6: (7, 5), 7: (4, 3)}
    # Level-7 anchors of a 320 image: stride 320 / 3, centres at stride / 2 + i * stride.
    boxes = anchors.generate_anchor_boxes(320, 320, 7, 7, 1, [1.0], 3.0)
    stride = 320 / 3
    assert boxes.shape == (9, 4)
    np.testing.assert_allclose(boxes[4], [stride * 1.5 - 1.5 * stride] * 2
                               + [stride * 1.5 + 1.5 * stride] * 2, rtol=1e-6, atol=1e-4)


def test_anchor_table_one_scale_two_ratios():
    got = anchors.generate_anchor_boxes(64, 64, 5, 5, num_scales=1,
                                        aspect_ratios=[1.0, 2.0], anchor_scale=1.0)
    expected = _f32([
        [0, 0, 32, 32], _box(16, 16, 8 * S2, 16 * S2),    # (y=16, x=16)
        [0, 32, 32, 64], _box(16, 48, 8 * S2, 16 * S2),   # (y=16, x=48)
        [32, 0, 64, 32], _box(48, 16, 8 * S2, 16 * S2),   # (y=48, x=16)
        [32, 32, 64, 64], _box(48, 48, 8 * S2, 16 * S2),  # (y=48, x=48)
    ])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    # Spelled-out numbers of the first ratio-2 anchor: 16 -+ 11.3137, 16 -+ 22.6274.
    np.testing.assert_allclose(got[1], [4.686292, -6.627417, 27.313708, 38.627417],
                               rtol=1e-6)


def test_anchor_table_two_scales_octave_outer():
    got = anchors.generate_anchor_boxes(64, 64, 5, 5, num_scales=2,
                                        aspect_ratios=[1.0, 2.0], anchor_scale=1.0)
    rows = []
    for cy in (16, 48):
        for cx in (16, 48):
            rows += [_box(cy, cx, 16, 16),             # octave 0, ratio 1
                     _box(cy, cx, 8 * S2, 16 * S2),    # octave 0, ratio 2
                     _box(cy, cx, 16 * S2, 16 * S2),   # octave 1, ratio 1
                     _box(cy, cx, 16, 32)]             # octave 1, ratio 2: 64 wide, 32 high
    np.testing.assert_array_equal(got, _f32(rows))
    np.testing.assert_array_equal(got[3], [0, -16, 32, 48])


def test_non_square_image_and_level_order():
    # 64 high x 128 wide, levels 4..5, one square anchor of stride size per location.
    got = anchors.generate_anchor_boxes(64, 128, 4, 5, num_scales=1,
                                        aspect_ratios=[1.0], anchor_scale=1.0)
    assert got.shape == (4 * 8 + 2 * 4, 4)
    # Level 4: stride 16, centres y in {8, 24, 40, 56}, x in {8, ..., 120}, half 8.
    np.testing.assert_array_equal(got[0], [0, 0, 16, 16])
    np.testing.assert_array_equal(got[1], [0, 16, 16, 32])     # x runs fastest
    np.testing.assert_array_equal(got[8], [16, 0, 32, 16])     # then y
    np.testing.assert_array_equal(got[31], [48, 112, 64, 128])
    # Level 5: stride 32, centres y in {16, 48}, x in {16, 48, 80, 112}, half 16.
    np.testing.assert_array_equal(got[32:], _f32([
        [0, 0, 32, 32], [0, 32, 32, 64], [0, 64, 32, 96], [0, 96, 32, 128],
        [32, 0, 64, 32], [32, 32, 64, 64], [32, 64, 64, 96], [32, 96, 64, 128]]))


def test_d0_anchor_count_and_cache():
    boxes = anchors.generate_anchor_boxes(512, 512, 3, 7, 3, [1.0, 2.0, 0.5], 4.0)
    # (64^2 + 32^2 + 16^2 + 8^2 + 4^2) locations * 9 anchors.
    assert boxes.shape == (49104, 4)
    again = anchors.generate_anchor_boxes(512, 512, 3, 7, 3, (1.0, 2.0, 0.5), 4.0)
    assert again is boxes
    assert not boxes.flags.writeable


# Labeler fixture: 64x64, level 5, one 32x32 anchor per location:
#   A0 [0,0,32,32]  A1 [0,32,32,64]  A2 [32,0,64,32]  A3 [32,32,64,64]
def _labeler(match=0.5, unmatched=0.5):
    shapes = anchors.level_shapes(64, 64, 5, 5)
    boxes = anchors.generate_anchor_boxes(64, 64, 5, 5, 1, [1.0], 1.0)
    return anchors.AnchorLabeler(boxes, shapes, 1, match, unmatched)


def _label(labeler, boxes, classes, crowd=None):
    crowd = [0] * len(classes) if crowd is None else crowd
    cls_t, box_t, num_pos = labeler.label(tf.constant(boxes, tf.float32, [len(boxes), 4]),
                                          tf.constant(classes, tf.int32, [len(classes)]),
                                          tf.constant(crowd, tf.int32, [len(crowd)]))
    return cls_t[5].numpy().reshape(-1), box_t[5].numpy().reshape(-1, 4), float(num_pos)


def test_box_equal_to_anchor_is_positive_with_zero_codes():
    cls_t, box_t, num_pos = _label(_labeler(), [[0, 32, 32, 64]], [2])
    np.testing.assert_array_equal(cls_t, [-1, 2, -1, -1])
    np.testing.assert_array_equal(box_t, np.zeros((4, 4)))
    assert num_pos == 1.0


def test_output_shapes_per_level():
    labeler = _labeler()
    cls_t, box_t, num_pos = labeler.label(tf.zeros([0, 4]), tf.zeros([0], tf.int32),
                                          tf.zeros([0], tf.bool))
    assert cls_t[5].shape == (2, 2, 1) and cls_t[5].dtype == tf.int32
    assert box_t[5].shape == (2, 2, 4) and box_t[5].dtype == tf.float32
    np.testing.assert_array_equal(cls_t[5].numpy().reshape(-1), [-1] * 4)
    assert float(num_pos) == 0.0


def test_low_iou_anchor_is_negative():
    # Box [0,0,32,40] (area 1280): IoU(A0) = 1024/1280 = 0.8;
    # IoU(A1) = (32*8) / (1024 + 1280 - 256) = 0.125 -> negative.
    cls_t, box_t, num_pos = _label(_labeler(), [[0, 0, 32, 40]], [1])
    np.testing.assert_array_equal(cls_t, [1, -1, -1, -1])
    # Codes vs A0 (centre 16,16, size 32x32): box centre (16, 20), size 32 x 40.
    np.testing.assert_allclose(box_t[0], [0.0, 4 / 32, 0.0, np.log(40 / 32)], rtol=1e-5)
    assert num_pos == 1.0


def test_between_thresholds_is_ignored():
    # Box [4,32,64,64] (area 60*32 = 1920):
    #   IoU(A3) = 1024 / 1920 = 0.5333 -> positive
    #   IoU(A1) = (28*32) / (1024 + 1920 - 896) = 896 / 2048 = 0.4375
    cls_t, _, num_pos = _label(_labeler(0.5, 0.4), [[4, 32, 64, 64]], [0])
    np.testing.assert_array_equal(cls_t, [-1, -2, -1, 0])
    assert num_pos == 1.0
    # With equal thresholds 0.5/0.5 there is no ignore band: A1 is negative.
    cls_t, _, _ = _label(_labeler(0.5, 0.5), [[4, 32, 64, 64]], [0])
    np.testing.assert_array_equal(cls_t, [-1, -1, -1, 0])


def test_crowd_box_ignores_its_anchors_and_makes_no_positives():
    # Crowd box equal to A2: IoU 1 >= 0.5 -> ignored, never positive.
    # Crowd box [0,0,8,32]: IoU(A0) = 256/1024 = 0.25 < 0.5 -> A0 stays negative, and
    # crowd boxes are never force-matched.
    cls_t, box_t, num_pos = _label(_labeler(), [[32, 0, 64, 32], [0, 0, 8, 32]], [1, 1],
                                   crowd=[1, 1])
    np.testing.assert_array_equal(cls_t, [-1, -1, -2, -1])
    np.testing.assert_array_equal(box_t, np.zeros((4, 4)))
    assert num_pos == 0.0


def test_padding_rows_have_no_effect():
    labeler = _labeler()
    plain = _label(labeler, [[0, 0, 32, 40]], [1])
    # Padding rows (class -1) sit exactly on anchors A1 and A3 and would otherwise win.
    padded = _label(labeler, [[0, 0, 32, 40], [0, 32, 32, 64], [32, 32, 64, 64]],
                    [1, -1, -1])
    for got, want in zip(padded, plain):
        np.testing.assert_array_equal(got, want)


def test_force_match_gives_tiny_box_its_best_anchor():
    # [10,10,14,14]: IoU(A0) = 16/1024, far below 0.5, but A0 is its best anchor.
    cls_t, box_t, num_pos = _label(_labeler(), [[10, 10, 14, 14]], [2])
    np.testing.assert_array_equal(cls_t, [2, -1, -1, -1])
    # Centre (12, 12), size 4 vs anchor centre (16, 16), size 32.
    np.testing.assert_allclose(box_t[0], [-4 / 32, -4 / 32, np.log(4 / 32), np.log(4 / 32)],
                               rtol=1e-5)
    assert num_pos == 1.0


def test_force_match_overrides_a_better_box_for_that_anchor():
    # P = [0,0,32,64] (area 2048): IoU(A0) = IoU(A1) = 1024/2048 = 0.5 -> both match P.
    # Tiny T = [10,40,14,44] lies in A1 (IoU 16/1024), A1 is its best anchor, so the
    # force match hands A1 to T.
    cls_t, _, num_pos = _label(_labeler(), [[0, 0, 32, 64], [10, 40, 14, 44]], [0, 1])
    np.testing.assert_array_equal(cls_t, [0, 1, -1, -1])
    assert num_pos == 2.0


def test_labeler_inside_dataset_map_with_varying_box_counts():
    labeler = _labeler()
    examples = [
        ([[0, 32, 32, 64]], [2], [0]),
        ([], [], []),
        ([[32, 0, 64, 32], [4, 32, 64, 64]], [0, 1], [0, 0]),
    ]

    def gen():
        for boxes, classes, crowd in examples:
            yield (np.array(boxes, np.float32).reshape(-1, 4), np.array(classes, np.int32),
                   np.array(crowd, np.int32))

    spec = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.int32))
    dataset = tf.data.Dataset.from_generator(gen, output_signature=spec)
    dataset = dataset.map(lambda b, c, k: labeler.label(b, c, k))
    got = [(c[5].numpy().reshape(-1).tolist(), float(n)) for c, _, n in dataset]
    assert got == [([-1, 2, -1, -1], 1.0),
                   ([-1, -1, -1, -1], 0.0),
                   ([-1, -1, 0, 1], 2.0)]


def test_labeler_rejects_mismatched_anchor_table():
    boxes = anchors.generate_anchor_boxes(64, 64, 5, 5, 1, [1.0], 1.0)
    with pytest.raises(ValueError, match='anchor_boxes has 4 rows'):
        anchors.AnchorLabeler(boxes, anchors.level_shapes(64, 64, 5, 5), 2)


def test_factored_grid_iou_equals_dense_pairwise_iou():
    # The labeler builds IoUs per level from row/column factors; they must equal the
    # dense iou_reference.pairwise_iou exactly, across levels, scales and ratios.
    import iou_reference  # pylint: disable=import-outside-toplevel
    shapes = anchors.level_shapes(64, 128, 3, 5)
    boxes = anchors.generate_anchor_boxes(64, 128, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    labeler = anchors.AnchorLabeler(boxes, shapes, 9)
    gt_boxes = tf.constant([[0, 0, 64, 128], [3, 7, 20, 50], [30, 90, 31, 91],
                            [10, 10, 10, 10]], tf.float32)
    factored = tf.concat(labeler._level_ious(gt_boxes), axis=1)  # pylint: disable=protected-access
    np.testing.assert_array_equal(factored.numpy(),
                                  iou_reference.pairwise_iou(gt_boxes, boxes).numpy())


def test_labeler_rejects_non_grid_anchor_table():
    boxes = np.array(anchors.generate_anchor_boxes(64, 64, 5, 5, 1, [1.0], 1.0))
    boxes[3] += 1.0
    with pytest.raises(ValueError, match='not a regular grid'):
        anchors.AnchorLabeler(boxes, anchors.level_shapes(64, 64, 5, 5), 1)
