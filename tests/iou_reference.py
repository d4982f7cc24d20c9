"""Dense IoU of every box pair: the reference the anchor labeler's factored IoU is checked
against (tests/ops/test_anchors.py). Production code never needs the dense [N, M] form."""
import tensorflow as tf


def pairwise_iou(boxes1, boxes2):
    """Intersection over union of every box in `boxes1` with every box in `boxes2`.

    Args:
      boxes1: float tensor [N, 4], [ymin, xmin, ymax, xmax].
      boxes2: float tensor [M, 4], same frame and dtype as `boxes1`.

    Returns:
      Tensor [N, M] of IoU in [0, 1], dtype of the inputs. Pairs whose union is
      empty (two zero-area boxes) give 0.
    """
    boxes1 = tf.convert_to_tensor(boxes1)
    boxes2 = tf.convert_to_tensor(boxes2, dtype=boxes1.dtype)
    assert boxes1.shape[-1] == 4 and boxes2.shape[-1] == 4
    # [N, 1] columns against [1, M] rows broadcast to [N, M] without a [N, M, 4] copy.
    ymin1, xmin1, ymax1, xmax1 = tf.split(boxes1, 4, axis=-1)
    ymin2, xmin2, ymax2, xmax2 = tf.split(tf.transpose(boxes2), 4, axis=0)
    zero = tf.zeros([], boxes1.dtype)
    inter_h = tf.maximum(zero, tf.minimum(ymax1, ymax2) - tf.maximum(ymin1, ymin2))
    inter_w = tf.maximum(zero, tf.minimum(xmax1, xmax2) - tf.maximum(xmin1, xmin2))
    intersection = inter_h * inter_w
    area1 = (ymax1 - ymin1) * (xmax1 - xmin1)
    area2 = (ymax2 - ymin2) * (xmax2 - xmin2)
    union = area1 + area2 - intersection
    return tf.math.divide_no_nan(intersection, union)
