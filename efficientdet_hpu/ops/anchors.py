"""Anchor geometry and per-image target assignment (see docs/CONTRACTS.md).

Anchors are `[ymin, xmin, ymax, xmax]` in absolute pixels of the network input,
ordered by level, then y, then x, then (octave scale, aspect ratio) with the
octave outer, so anchor index a = octave * len(aspect_ratios) + ratio_index.
At level l the stride is 2**l, centres sit at stride/2 + i*stride, the base size
is anchor_scale * stride * 2**(octave / num_scales), and an aspect ratio r
(width / height) gives width = base*sqrt(r), height = base/sqrt(r); an (x, y) pair, as
google/automl also accepts, gives width = base*x, height = base*y.
"""

import functools

import numpy as np
import tensorflow as tf

from efficientdet_hpu.ops import box_ops

# Anchor state codes in cls_targets (positives carry their class index >= 0).
NEGATIVE = -1
IGNORED = -2

_INT32_MAX = np.iinfo(np.int32).max


# Levels up to 5 (EfficientNet's, stride 32) halve the image exactly; the extra levels above
# halve with rounding up, as google/automl's utils.get_feat_sizes and 'same' max pooling do,
# so that EfficientDet-Lite0's 320 (or Lite2's 448) keeps its 7 levels: 10 -> 5 -> 3.
EXACT_LEVELS = 5


def exact_stride(max_level):
    """What the image height and width must be multiples of: 2**min(max_level, 5)."""
    return 2 ** min(max_level, EXACT_LEVELS)


def level_shapes(image_height, image_width, min_level, max_level):
    """Feature-map size of every pyramid level.

    Args:
      image_height, image_width: network input size in pixels, multiples of
        exact_stride(max_level).
      min_level, max_level: first and last pyramid level (inclusive).

    Returns:
      dict {level: (height, width)}: image // 2**level up to level 5, then
      ceil(previous / 2) per level (320 px: level 5 is 10, 6 is 5, 7 is 3).
    """
    stride = exact_stride(max_level)
    if image_height % stride or image_width % stride:
        raise ValueError(
            'image size %dx%d (height x width) is not a multiple of 2**min(max_level, %d) = %d; '
            'pick an image size divisible by %d or lower max_level'
            % (image_height, image_width, EXACT_LEVELS, stride, stride))
    if not 0 <= min_level <= max_level:
        raise ValueError('need 0 <= min_level <= max_level, got min_level=%s max_level=%s'
                         % (min_level, max_level))
    shapes, height, width = {}, image_height, image_width
    for level in range(1, max_level + 1):
        height, width = (height + 1) // 2, (width + 1) // 2
        if level >= min_level:
            shapes[level] = (height, width)
    if min_level == 0:
        shapes[0] = (image_height, image_width)
    return dict(sorted(shapes.items()))


def generate_anchor_boxes(image_height, image_width, min_level, max_level,
                          num_scales, aspect_ratios, anchor_scale):
    """All anchors of an image, in contract order (level, y, x, octave, ratio).

    Args:
      image_height, image_width: network input size in pixels.
      min_level, max_level: pyramid levels (inclusive).
      num_scales: octave scales per location (2**(k / num_scales), k < num_scales).
      aspect_ratios: sequence of width / height ratios, e.g. [1.0, 2.0, 0.5, 0.25], or of
        automl's (x, y) pairs of width and height multipliers, e.g. [(1.4, 0.7)]; may mix.
      anchor_scale: base anchor size in units of the level stride.

    Returns:
      read-only np.ndarray float32 [num_anchors_total, 4], [ymin, xmin, ymax, xmax]
      absolute pixels. Results are cached per argument set (shared, hence read-only).
    """
    return _anchor_boxes_cached(int(image_height), int(image_width), int(min_level),
                                int(max_level), int(num_scales),
                                tuple(_ratio_key(r) for r in aspect_ratios), float(anchor_scale))


def _ratio_key(ratio):
    """Hashable form of one aspect ratio: a float (width / height) or an (x, y) tuple."""
    if isinstance(ratio, (list, tuple, np.ndarray)):
        if len(ratio) != 2:
            raise ValueError('an aspect ratio is a number (width / height) or an (x, y) pair, '
                             'got %r' % (ratio,))
        return (float(ratio[0]), float(ratio[1]))
    return float(ratio)


@functools.lru_cache(maxsize=32)
def _anchor_boxes_cached(image_height, image_width, min_level, max_level,
                         num_scales, aspect_ratios, anchor_scale):
    shapes = level_shapes(image_height, image_width, min_level, max_level)
    per_level = [_level_anchor_boxes(image_height, image_width, shapes[level],
                                     num_scales, aspect_ratios, anchor_scale)
                 for level in range(min_level, max_level + 1)]
    boxes = np.concatenate(per_level, axis=0).astype(np.float32)
    boxes.setflags(write=False)
    return boxes


def _level_anchor_boxes(image_height, image_width, shape, num_scales,
                        aspect_ratios, anchor_scale):
    """Anchors of one level as float64 [h * w * A, 4]."""
    height, width = shape
    stride_y = image_height / height
    stride_x = image_width / width
    half_sizes = []  # (half height, half width) per anchor, octave outer.
    for octave in range(num_scales):
        octave_scale = 2.0 ** (octave / num_scales)
        for ratio in aspect_ratios:
            if np.min(ratio) <= 0:
                raise ValueError('aspect_ratios must be positive (width / height, or (x, y) '
                                 'pairs), got %s' % (aspect_ratios,))
            base_y = anchor_scale * stride_y * octave_scale
            base_x = anchor_scale * stride_x * octave_scale
            if isinstance(ratio, tuple):  # automl's (x, y): width and height multipliers.
                half_sizes.append((base_y * ratio[1] / 2.0, base_x * ratio[0] / 2.0))
            else:
                half_sizes.append((base_y / np.sqrt(ratio) / 2.0, base_x * np.sqrt(ratio) / 2.0))
    half_sizes = np.array(half_sizes, dtype=np.float64)          # [A, 2]
    centre_y = stride_y / 2.0 + np.arange(height) * stride_y     # [h]
    centre_x = stride_x / 2.0 + np.arange(width) * stride_x      # [w]
    cy = np.broadcast_to(centre_y[:, None, None], (height, width, len(half_sizes)))
    cx = np.broadcast_to(centre_x[None, :, None], (height, width, len(half_sizes)))
    half_h, half_w = half_sizes[:, 0], half_sizes[:, 1]
    boxes = np.stack([cy - half_h, cx - half_w, cy + half_h, cx + half_w], axis=-1)
    return boxes.reshape(-1, 4)


class AnchorLabeler:
    """Assigns classification and box-regression targets to every anchor of an image.

    IoU matching as the reference's ArgMaxMatcher with force_match_for_each_row:
    an anchor's best IoU >= match_threshold -> positive, < unmatched_threshold ->
    negative (-1), otherwise ignored (-2); then every real ground-truth box is
    forced onto its highest-IoU anchor. Crowd boxes never create positives: an
    anchor whose best box is a crowd box with IoU >= unmatched_threshold is
    ignored. Padding rows (class < 0) take no part.

    The IoU matrix is the costly step (~49k anchors x up to 100 boxes at 512 px).
    Anchor y-extents depend only on (row, anchor) and x-extents on (column,
    anchor), so intersections are built per level from two small factors instead
    of a dense [N, M, 4] comparison.
    """

    # `level_shapes` shadows the module function on purpose: it is the contract's name.
    def __init__(self, anchor_boxes, level_shapes, anchors_per_location,
                 match_threshold=0.5, unmatched_threshold=0.5):
        """Checks the anchor table against the level shapes and factors it per level.

        Args:
          anchor_boxes: float array [num_anchors, 4] from `generate_anchor_boxes`.
          level_shapes: dict {level: (h, w)} from `level_shapes`.
          anchors_per_location: A = num_scales * len(aspect_ratios).
          match_threshold: IoU at or above which an anchor is positive.
          unmatched_threshold: IoU below which an anchor is negative.
        """
        self._anchor_boxes = np.asarray(anchor_boxes, dtype=np.float32).reshape(-1, 4)
        self._levels = sorted(level_shapes)
        self._level_shapes = {level: tuple(level_shapes[level]) for level in self._levels}
        self._anchors_per_location = int(anchors_per_location)
        self._level_sizes = [h * w * self._anchors_per_location
                             for h, w in (self._level_shapes[l] for l in self._levels)]
        if sum(self._level_sizes) != len(self._anchor_boxes):
            raise ValueError(
                'anchor_boxes has %d rows but level_shapes %s with %d anchors per location '
                'need %d; build both from the same image size, levels and anchor settings'
                % (len(self._anchor_boxes), self._level_shapes, self._anchors_per_location,
                   sum(self._level_sizes)))
        if not 0.0 < unmatched_threshold <= match_threshold <= 1.0:
            raise ValueError('need 0 < unmatched_threshold <= match_threshold <= 1, got '
                             'unmatched_threshold=%s match_threshold=%s'
                             % (unmatched_threshold, match_threshold))
        self._match_threshold = float(match_threshold)
        self._unmatched_threshold = float(unmatched_threshold)
        self._grids = self._factor_grids()

    def _factor_grids(self):
        """Per level: y extents [h, 1, A, 2], x extents [1, w, A, 2], areas [h, w, A]."""
        grids = []
        level_boxes = np.split(self._anchor_boxes, np.cumsum(self._level_sizes)[:-1])
        for level, boxes in zip(self._levels, level_boxes):
            height, width = self._level_shapes[level]
            grid = boxes.reshape(height, width, self._anchors_per_location, 4)
            y_extent = grid[:, :1, :, 0::2]   # (ymin, ymax) from the first column
            x_extent = grid[:1, :, :, 1::2]   # (xmin, xmax) from the first row
            rebuilt = np.concatenate(np.broadcast_arrays(y_extent, x_extent), axis=-1)
            if not np.array_equal(rebuilt[..., [0, 2, 1, 3]], grid):
                raise ValueError('anchor_boxes of level %d are not a regular grid (y extents '
                                 'shared along each row, x extents along each column); build '
                                 'them with anchors.generate_anchor_boxes' % level)
            areas = ((y_extent[..., 1] - y_extent[..., 0]) * (x_extent[..., 1] - x_extent[..., 0]))
            grids.append((y_extent, x_extent, areas))
        return grids

    def label(self, gt_boxes, gt_classes, is_crowd):
        """Targets for one image.

        Args:
          gt_boxes: float32 [N, 4], [ymin, xmin, ymax, xmax] absolute pixels of the
            network input. N may be unknown at graph-construction time and may be 0.
          gt_classes: int [N], class index 0..C-1; rows with class < 0 are padding.
          is_crowd: bool or int [N], nonzero for COCO crowd regions.

        Returns:
          (cls_targets, box_targets, num_positives): cls_targets {level: int32
          [h, w, A]} with the class index for positives, -1 negatives, -2 ignored;
          box_targets {level: float32 [h, w, A*4]} codes [ty, tx, th, tw] (0 where
          not positive); num_positives float32 scalar.
        """
        gt_boxes = tf.reshape(tf.cast(gt_boxes, tf.float32), [-1, 4])
        gt_classes = tf.reshape(tf.cast(gt_classes, tf.int32), [-1])
        is_crowd = tf.reshape(tf.cast(is_crowd, tf.bool), [-1])
        # Padding rows take no part, so drop them before the IoU matrix: a pipeline
        # padding to 100 boxes then pays only for the real ones.
        real = gt_classes >= 0
        gt_boxes = tf.boolean_mask(gt_boxes, real)
        gt_classes = tf.boolean_mask(gt_classes, real)
        is_crowd = tf.boolean_mask(is_crowd, real)
        # A sentinel row (zero-area box: IoU 0 with every anchor, class -1 so never
        # forced) keeps the argmaxes defined when the image has no boxes at all.
        gt_boxes = tf.concat([gt_boxes, tf.zeros([1, 4], tf.float32)], axis=0)
        gt_classes = tf.concat([gt_classes, tf.constant([-1], tf.int32)], axis=0)
        is_crowd = tf.concat([is_crowd, tf.constant([False])], axis=0)

        matched_gt, positive, ignored = self._match(gt_boxes, gt_classes, is_crowd)
        cls_flat = tf.where(positive, tf.gather(gt_classes, matched_gt),
                            tf.where(ignored, IGNORED, NEGATIVE))
        codes = box_ops.encode_boxes(tf.gather(gt_boxes, matched_gt),
                                     tf.constant(self._anchor_boxes))
        box_flat = tf.where(positive[:, None], codes, tf.zeros_like(codes))
        num_positives = tf.reduce_sum(tf.cast(positive, tf.float32))
        return self._split_levels(cls_flat, box_flat) + (num_positives,)

    def _level_ious(self, gt_boxes):
        """IoU of every box with every anchor: a list over levels of [N, h*w*A]."""
        ymin, xmin, ymax, xmax = [c[:, None, None, None]
                                  for c in tf.unstack(gt_boxes, num=4, axis=1)]
        gt_areas = (ymax - ymin) * (xmax - xmin)
        ious = []
        for y_extent, x_extent, anchor_areas in self._grids:
            inter_h = tf.nn.relu(tf.minimum(ymax, y_extent[..., 1]) -
                                 tf.maximum(ymin, y_extent[..., 0]))        # [N, h, 1, A]
            inter_w = tf.nn.relu(tf.minimum(xmax, x_extent[..., 1]) -
                                 tf.maximum(xmin, x_extent[..., 0]))        # [N, 1, w, A]
            intersection = inter_h * inter_w                                 # [N, h, w, A]
            union = gt_areas + anchor_areas - intersection
            iou = tf.math.divide_no_nan(intersection, union)
            ious.append(tf.reshape(iou, [tf.shape(gt_boxes)[0], -1]))
        return ious

    def _match(self, gt_boxes, gt_classes, is_crowd):
        """Returns (matched_gt int32 [M], positive bool [M], ignored bool [M])."""
        ious = self._level_ious(gt_boxes)
        best_gt = tf.concat([tf.argmax(iou, axis=0, output_type=tf.int32) for iou in ious], 0)
        best_iou = tf.concat([tf.reduce_max(iou, axis=0) for iou in ious], 0)
        best_is_crowd = tf.gather(is_crowd, best_gt)
        positive = (best_iou >= self._match_threshold) & ~best_is_crowd
        ignored = (best_iou >= self._unmatched_threshold) & ~positive

        # Force match: each real box claims its best anchor; if several boxes claim the
        # same anchor the lowest row wins (as the reference's argmax over one-hots).
        # A box overlapping no anchor at all (zero area) is not forced: its codes
        # would be log(0)-sized garbage.
        best_anchor, row_best_iou = self._best_anchor_per_box(ious)
        eligible = (gt_classes >= 0) & ~is_crowd & (row_best_iou > 0.0)
        row_ids = tf.range(tf.shape(gt_boxes)[0], dtype=tf.int32)
        forced_gt = tf.math.unsorted_segment_min(
            tf.where(eligible, row_ids, _INT32_MAX * tf.ones_like(row_ids)),
            best_anchor, num_segments=len(self._anchor_boxes))
        forced = forced_gt < _INT32_MAX
        matched_gt = tf.where(forced, forced_gt, best_gt)
        return matched_gt, positive | forced, ignored & ~forced

    def _best_anchor_per_box(self, ious):
        """Flat index int32 [N] and IoU [N] of each box's best anchor (first on ties)."""
        offsets = np.cumsum([0] + self._level_sizes[:-1]).astype(np.int32)
        level_best = tf.stack([tf.reduce_max(iou, axis=1) for iou in ious])         # [L, N]
        level_arg = tf.stack([tf.argmax(iou, axis=1, output_type=tf.int32) + offset
                              for iou, offset in zip(ious, offsets)])               # [L, N]
        best_level = tf.argmax(level_best, axis=0, output_type=tf.int32)             # [N]
        best_anchor = tf.gather(tf.transpose(level_arg), best_level, batch_dims=1)
        return best_anchor, tf.reduce_max(level_best, axis=0)

    def _split_levels(self, cls_flat, box_flat):
        """Flat per-anchor targets -> ({level: [h, w, A]}, {level: [h, w, A*4]})."""
        cls_targets, box_targets = {}, {}
        cls_parts = tf.split(cls_flat, self._level_sizes, axis=0)
        box_parts = tf.split(box_flat, self._level_sizes, axis=0)
        for level, cls_part, box_part in zip(self._levels, cls_parts, box_parts):
            height, width = self._level_shapes[level]
            cls_targets[level] = tf.reshape(cls_part, [height, width, self._anchors_per_location])
            box_targets[level] = tf.reshape(box_part,
                                            [height, width, self._anchors_per_location * 4])
        return cls_targets, box_targets
