"""Losses against NumPy formulas written here and against hand-computed totals."""

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.ops import losses


def _numpy_focal(x, t, alpha, gamma, smoothing):
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    p = 1.0 / (1.0 + np.exp(-x))
    p_t = t * p + (1 - t) * (1 - p)
    alpha_t = t * alpha + (1 - t) * (1 - alpha)
    t_smooth = t * (1 - smoothing) + 0.5 * smoothing
    cross_entropy = -(t_smooth * np.log(p) + (1 - t_smooth) * np.log(1 - p))
    return alpha_t * (1 - p_t) ** gamma * cross_entropy


@pytest.mark.parametrize('alpha,gamma,smoothing', [(0.25, 1.5, 0.0), (0.25, 2.0, 0.1),
                                                   (0.5, 0.0, 0.2)])
def test_focal_loss_matches_numpy(alpha, gamma, smoothing):
    logits = [[-6.0, -1.5, -0.2, 0.0, 0.3, 2.0, 7.0]] * 2
    targets = [[0, 1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 1, 0, 1]]
    got = losses.focal_loss(tf.constant(logits), tf.constant(targets, tf.float32),
                            alpha=alpha, gamma=gamma, label_smoothing=smoothing)
    np.testing.assert_allclose(got.numpy(), _numpy_focal(logits, targets, alpha, gamma,
                                                         smoothing), rtol=1e-5)


def test_focal_loss_is_finite_for_large_logits():
    got = losses.focal_loss(tf.constant([-100.0, 100.0]), tf.constant([1.0, 0.0]))
    assert np.all(np.isfinite(got.numpy()))


@pytest.mark.parametrize('gamma', [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 1.7])
def test_nonnegative_power_values_and_gradient(gamma):
    x = tf.constant([0.0, 1e-12, 1e-4, 0.25, 0.5, 0.999, 1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = losses.nonnegative_power(x, gamma)
    gradient = tape.gradient(y, x).numpy()
    x64 = x.numpy().astype(np.float64)
    np.testing.assert_allclose(y.numpy(), np.power(x64, gamma), rtol=2e-6, atol=1e-30)
    if gamma >= 1.0:  # finite everywhere, including at 0 where x ** (gamma - 1) is finite
        assert np.all(np.isfinite(gradient))  # d/dx at 0: 1 for gamma 1, else 0
        np.testing.assert_allclose(gradient[1:], gamma * np.power(x64[1:], gamma - 1),
                                   rtol=1e-5, atol=2e-7)
        assert gradient[0] == pytest.approx(1.0 if gamma == 1.0 else 0.0, abs=1e-6)


def test_focal_loss_gradient_is_finite_for_saturated_logits():
    logits = tf.constant([-100.0, 100.0, -100.0, 100.0, 0.0])
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = tf.reduce_sum(losses.focal_loss(logits, tf.constant([1.0, 0.0, 0.0, 1.0, 1.0])))
    assert np.all(np.isfinite(tape.gradient(loss, logits).numpy()))


def test_huber_matches_numpy_and_skips_zero_targets():
    outputs = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, -0.6, 0.7, 0.8]], np.float32)
    targets = np.array([[0.05, -0.2, 0.0, 0.1], [0.0, 0.0, 0.0, 0.0]], np.float32)
    delta = 0.1
    err = np.abs(outputs - targets).astype(np.float64)
    per_entry = np.where(err <= delta, 0.5 * err ** 2, delta * (err - 0.5 * delta))
    expected = np.sum(per_entry * (targets != 0))
    got = losses.huber_box_loss(tf.constant(outputs), tf.constant(targets), delta)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # By hand: 0.5*0.05^2 + 0.1*(0.4-0.05) + 0.1*(0.3-0.05) = 0.00125 + 0.035 + 0.025
    np.testing.assert_allclose(float(got), 0.06125, rtol=1e-5)


def _tiny_case(class_logits=(0.0, 0.0, 0.0, 0.0), cls_targets=(1, -1)):
    # One level (3), batch 1, a 1x2 grid, A = 1 anchor, C = 2 classes.
    class_outputs = {3: tf.constant(class_logits, tf.float32, [1, 1, 2, 2])}
    box_outputs = {3: tf.constant([0.1, 0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8], tf.float32,
                                  [1, 1, 2, 4])}
    targets_cls = {3: tf.constant(cls_targets, tf.int32, [1, 1, 2, 1])}
    targets_box = {3: tf.constant([0.05, -0.2, 0.0, 0.1, 0, 0, 0, 0], tf.float32,
                                  [1, 1, 2, 4])}
    return class_outputs, box_outputs, targets_cls, targets_box


_SETTINGS = dict(num_classes=2, anchors_per_location=1, alpha=0.25, gamma=2.0, delta=0.1,
                 box_loss_weight=50.0, label_smoothing=0.0)


def test_detection_loss_normalisation_by_hand():
    # All logits 0: p = 0.5, p_t = 0.5, (1 - p_t)^2 = 0.25, cross-entropy = log 2.
    # Anchor 0 (class 1): class-0 entry 0.75*0.25*log2, class-1 entry 0.25*0.25*log2.
    # Anchor 1 (negative): two entries of 0.75*0.25*log2.
    # Sum = (3*0.1875 + 0.0625) * log2 = 0.625 * log2; normaliser = 1 positive + 1 = 2.
    result = losses.detection_loss(*_tiny_case(), tf.constant([1.0]), **_SETTINGS)
    cls_loss = 0.625 * np.log(2.0) / 2.0
    box_loss = 0.06125 / (2.0 * 4.0)  # Huber sum from test_huber..., over 4 * normaliser
    np.testing.assert_allclose(float(result['cls_loss']), cls_loss, rtol=1e-5)
    np.testing.assert_allclose(float(result['box_loss']), box_loss, rtol=1e-5)
    assert float(result['iou_loss']) == 0.0
    np.testing.assert_allclose(float(result['total_loss']), cls_loss + 50.0 * box_loss,
                               rtol=1e-5)
    for value in result.values():
        assert value.dtype == tf.float32

    # A caller-supplied (e.g. cross-replica) normaliser is used verbatim.
    result = losses.detection_loss(*_tiny_case(), tf.constant([1.0]), normalizer=4.0,
                                   **_SETTINGS)
    np.testing.assert_allclose(float(result['cls_loss']), cls_loss / 2.0, rtol=1e-5)
    np.testing.assert_allclose(float(result['box_loss']), box_loss / 2.0, rtol=1e-5)


def test_ignored_anchors_contribute_nothing():
    # Anchor 1 ignored (-2): only anchor 0's entries count, whatever anchor 1 predicts.
    expected = (0.1875 + 0.0625) * np.log(2.0) / 2.0
    for anchor1_logits in ((0.0, 0.0), (5.0, -3.0)):
        case = _tiny_case(class_logits=(0.0, 0.0) + anchor1_logits, cls_targets=(1, -2))
        result = losses.detection_loss(*case, tf.constant([1.0]), **_SETTINGS)
        np.testing.assert_allclose(float(result['cls_loss']), expected, rtol=1e-5)


def test_low_precision_outputs_give_float32_losses():
    class_outputs, box_outputs, cls_t, box_t = _tiny_case()
    class_outputs = {3: tf.cast(class_outputs[3], tf.bfloat16)}
    box_outputs = {3: tf.cast(box_outputs[3], tf.float16)}
    result = losses.detection_loss(class_outputs, box_outputs, cls_t, box_t,
                                   tf.constant([1.0]), **_SETTINGS)
    assert result['total_loss'].dtype == tf.float32
    np.testing.assert_allclose(float(result['cls_loss']), 0.625 * np.log(2.0) / 2.0,
                               rtol=1e-5)


@pytest.mark.parametrize('iou_type', ['iou', 'giou', 'diou', 'ciou'])
def test_iou_losses_of_identical_boxes_are_zero(iou_type):
    boxes = tf.constant([[0., 0., 10., 10.], [5., 3., 25., 9.]])
    np.testing.assert_allclose(losses.iou_loss(boxes, boxes, iou_type).numpy(), [0.0, 0.0],
                               atol=1e-6)


def test_iou_family_hand_values():
    pred = tf.constant([[0., 0., 10., 10.], [0., 0., 10., 10.]])
    target = tf.constant([[0., 5., 10., 15.],     # half overlap: IoU 50/150 = 1/3
                          [0., 20., 10., 30.]])   # disjoint, 10 px gap
    # GIoU: enclosing areas 150 and 300, unions 150 and 200:
    #   1 - 1/3 + 0 = 2/3;   1 - 0 + (300 - 200)/300 = 4/3
    np.testing.assert_allclose(losses.iou_loss(pred, target, 'giou').numpy(),
                               [2 / 3, 4 / 3], rtol=1e-5)
    np.testing.assert_allclose(losses.iou_loss(pred, target, 'iou').numpy(), [2 / 3, 1.0],
                               rtol=1e-5)
    # DIoU, first pair: centres (5, 5) and (5, 10) -> 25; enclosing 10 x 15 -> 325.
    diou = 2 / 3 + 25 / 325
    np.testing.assert_allclose(losses.iou_loss(pred[:1], target[:1], 'diou').numpy(), [diou],
                               rtol=1e-5)
    # Same aspect ratio -> the CIoU aspect term v is 0 and CIoU = DIoU.
    np.testing.assert_allclose(losses.iou_loss(pred[:1], target[:1], 'ciou').numpy(), [diou],
                               rtol=1e-5)


def test_detection_loss_with_iou_term_masks_non_positives():
    class_outputs, _, cls_t, box_t = _tiny_case()
    # Anchor 0 predicts its target exactly; anchor 1 (negative) predicts codes whose
    # exp() overflows float32 - it must neither count nor turn anything into NaN.
    box_outputs = tf.Variable(tf.constant([0.05, -0.2, 0.0, 0.1, 0, 0, 500., 500.],
                                          tf.float32, [1, 1, 2, 4]))
    anchor_boxes = np.array([[0, 0, 8, 8], [0, 8, 8, 16]], np.float32)
    with tf.GradientTape() as tape:
        result = losses.detection_loss(class_outputs, {3: box_outputs}, cls_t, box_t,
                                       tf.constant([1.0]), iou_loss_type='giou',
                                       iou_loss_weight=1.0, anchor_boxes=anchor_boxes,
                                       **_SETTINGS)
    assert abs(float(result['iou_loss'])) < 1e-6
    grad = tape.gradient(result['total_loss'], box_outputs)
    assert np.all(np.isfinite(grad.numpy()))


def test_unknown_iou_loss_type_lists_valid_ones():
    with pytest.raises(ValueError, match='giou'):
        losses.detection_loss(*_tiny_case(), tf.constant([1.0]), iou_loss_type='gio',
                              **_SETTINGS)
