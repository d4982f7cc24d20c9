"""Box geometry on hand-checked values."""

import numpy as np
import tensorflow as tf

from efficientdet_hpu.ops import box_ops
import iou_reference


def test_pairwise_iou_hand_values():
    boxes1 = tf.constant([[0, 0, 10, 10],      # reference square, area 100
                          [0, 0, 0, 0]], tf.float32)  # zero-area box
    boxes2 = tf.constant([[0, 0, 10, 10],      # identical -> 1
                          [20, 20, 30, 30],    # disjoint -> 0
                          [0, 5, 10, 15],      # half overlap: 50 / (100 + 100 - 50) = 1/3
                          [10, 0, 20, 10]],    # touching edge only -> 0
                         tf.float32)
    got = iou_reference.pairwise_iou(boxes1, boxes2).numpy()
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got[0], [1.0, 0.0, 1.0 / 3.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], [0.0, 0.0, 0.0, 0.0])


def test_pairwise_iou_empty_inputs():
    got = iou_reference.pairwise_iou(tf.zeros([0, 4]), tf.ones([3, 4]))
    assert got.shape == (0, 3)


def test_encode_hand_value():
    # Anchor centre (16, 16), 32x32; box centre (20, 12), 16 high x 64 wide.
    codes = box_ops.encode_boxes(tf.constant([[12., -20., 28., 44.]]),
                                 tf.constant([[0., 0., 32., 32.]])).numpy()
    np.testing.assert_allclose(codes, [[4 / 32, -4 / 32, np.log(0.5), np.log(2.0)]],
                               rtol=1e-5)


def test_encode_decode_round_trip():
    anchors = tf.constant([[0., 0., 32., 32.], [10., 20., 74., 52.],
                           [-8., -8., 8., 8.], [100., 50., 228., 306.]])
    boxes = tf.constant([[3., 5., 30., 40.], [12., 25., 60., 49.],
                         [-20., 1., 3., 60.], [110., 40., 200., 330.]])
    codes = box_ops.encode_boxes(boxes, anchors)
    np.testing.assert_allclose(box_ops.decode_boxes(codes, anchors).numpy(), boxes.numpy(),
                               rtol=1e-5, atol=1e-4)


def test_encode_broadcasts_over_batch_and_zero_size_is_finite():
    anchors = tf.constant([[0., 0., 32., 32.], [5., 5., 5., 5.]])   # second is zero-size
    boxes = tf.constant([[[0., 0., 32., 32.], [5., 5., 5., 5.]]])   # [1, 2, 4]
    codes = box_ops.encode_boxes(boxes, anchors).numpy()
    assert codes.shape == (1, 2, 4)
    np.testing.assert_array_equal(codes, np.zeros((1, 2, 4)))
    codes = box_ops.encode_boxes(tf.constant([[1., 1., 1., 1.]]), anchors[:1]).numpy()
    assert np.all(np.isfinite(codes))


def test_clip_boxes_per_image_sizes():
    boxes = tf.constant([[[-5., 10., 120., 300.]], [[-5., 10., 120., 300.]]])  # [2, 1, 4]
    sizes = tf.constant([[100, 200], [150, 250]], tf.int32)[:, None, :]       # [2, 1, 2]
    got = box_ops.clip_boxes(boxes, sizes).numpy()
    np.testing.assert_array_equal(got, [[[0., 10., 100., 200.]], [[0., 10., 120., 250.]]])


def test_works_in_v1_graph():
    with tf.Graph().as_default():
        boxes = tf.compat.v1.placeholder(tf.float32, [None, 4])
        iou = iou_reference.pairwise_iou(boxes, boxes)
        with tf.compat.v1.Session() as sess:
            got = sess.run(iou, {boxes: [[0, 0, 10, 10], [0, 5, 10, 15]]})
    np.testing.assert_allclose(got, [[1, 1 / 3], [1 / 3, 1]], rtol=1e-6)
