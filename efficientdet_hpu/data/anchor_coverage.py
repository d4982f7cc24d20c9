"""Where a dataset's boxes land in the network input and how well the recipe's anchors fit them.

Nothing here is a second copy of the training geometry: the resize is dataloader.fit_window
itself (vectorised over the distinct image sizes with tf.vectorized_map, one call per output
size), the box mapping is dataloader.boxes_to_network_pixels' arithmetic on NumPy arrays, and
the anchors are anchors.generate_anchor_boxes' table. The IoU is the labeler's formula
(anchors.AnchorLabeler._level_ious) evaluated in float32 against each box's nearest anchor
centre per level: along each axis the overlap of two intervals only shrinks as their centres
move apart, so the nearest centre holds the best anchor of every shape and the best IoU over
those is the best IoU over the whole table, without an [N, num_anchors] matrix.

Training draws a scale multiplier m ~ U(jitter_min, jitter_max) per image and keeps a random
window of it. The doctor stands in for that draw with JITTER_SAMPLES multipliers at the
midpoints of equal slices of the range and the centre window (crop fraction 0.5, the mean
crop position); a box counts once per multiplier, dropped where the window cuts it off, as
training drops it. Box sizes are sqrt(width * height) in network pixels.
"""
import dataclasses
import functools
from typing import Tuple, Union

import numpy as np
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.ops import anchors

JITTER_SAMPLES = 4
SMALL_BOX_PX = 8.0  # "Under 8 px": sqrt(area) after the resize, below the finest stride.
SEARCH_BOXES_PER_CLASS = 2000  # Boxes per class the coverage check and the advice score.
WEAK_COVERAGE = 0.5  # Under it a class is weak: main.py warns, the doctor advises.
_CHUNK = 1 << 16  # Boxes per IoU block: [chunk, A] float32 arrays stay a few MB.

AspectRatio = Union[float, Tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class AnchorSetup:
    """The recipe fields the geometry depends on, as a hashable value.

    aspect_ratios: tuple of width / height floats or (x, y) pairs, as hparams_config holds
    them (lists there, tuples here). image_size: int or 'WIDTHxHEIGHT', as in the config.
    """
    image_size: Union[int, str]
    min_level: int
    max_level: int
    num_scales: int
    aspect_ratios: Tuple[AspectRatio, ...]
    anchor_scale: float
    match_threshold: float
    jitter_min: float
    jitter_max: float

    @classmethod
    def from_config(cls, config) -> 'AnchorSetup':
        """From an hparams_config.Config (or a params dict)."""
        ratios = tuple(tuple(r) if isinstance(r, (list, tuple)) else float(r)
                       for r in config['aspect_ratios'])
        return cls(config['image_size'], config['min_level'], config['max_level'],
                   config['num_scales'], ratios, float(config['anchor_scale']),
                   float(config['match_threshold']), float(config['jitter_min']),
                   float(config['jitter_max']))

    def replace(self, **changes) -> 'AnchorSetup':
        return dataclasses.replace(self, **changes)

    @property
    def output_size(self) -> Tuple[int, int]:
        """(height, width) of the network input."""
        return hparams_config.parse_image_size(self.image_size)

    @property
    def anchors_per_location(self) -> int:
        return self.num_scales * len(self.aspect_ratios)

    def anchor_settings(self) -> dict:
        return hparams_config.anchor_settings(hparams_config.Config(dataclasses.asdict(self)))

    def overrides(self) -> dict:
        """The fields the doctor may advise on, as hparams values (YAML-ready)."""
        return {'aspect_ratios': [list(r) if isinstance(r, tuple) else r
                                  for r in self.aspect_ratios],
                'anchor_scale': self.anchor_scale, 'image_size': self.image_size}


def scale_multipliers(setup: AnchorSetup, samples: int = JITTER_SAMPLES) -> np.ndarray:
    """float32 [K]: midpoints of `samples` equal slices of [jitter_min, jitter_max]."""
    if setup.jitter_max <= setup.jitter_min:
        return np.array([setup.jitter_min], np.float32)
    fractions = (np.arange(samples) + 0.5) / samples
    return (setup.jitter_min + (setup.jitter_max - setup.jitter_min) * fractions).astype(
        np.float32)


def fit_windows(image_sizes, output_size, multipliers, crop_fraction=(0.5, 0.5)):
    """dataloader.fit_window of every image at every scale multiplier.

    Args:
      image_sizes: int [M, 2] (height, width) of the original images.
      output_size: (height, width) of the network input.
      multipliers: float32 [K] scale multipliers (1 is the eval resize).
      crop_fraction: (y, x) position of the kept window in the spare room.

    Returns:
      (crop_offset, crop_size, resized_size), each int64 [M, K, 2], (y, x) pixels.
    """
    image_sizes = np.asarray(image_sizes, np.int64).reshape(-1, 2)
    multipliers = np.asarray(multipliers, np.float32).reshape(-1)
    if not len(image_sizes):
        empty = np.zeros((0, len(multipliers), 2), np.int64)
        return empty, empty, empty
    unique, inverse = np.unique(image_sizes, axis=0, return_inverse=True)
    sizes = np.repeat(unique, len(multipliers), axis=0).astype(np.int32)
    scales = np.tile(multipliers, len(unique))
    function = _window_function(tuple(int(s) for s in output_size),
                                tuple(float(f) for f in crop_fraction))
    # One traced function per output size, each traced once: TF's retracing warning, which
    # counts them together, does not apply.
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel('ERROR')
    try:
        windows = function(sizes, scales)
    finally:
        logger.setLevel(level)
    return tuple(w.numpy().astype(np.int64).reshape(len(unique), len(multipliers), 2)[
        inverse.reshape(-1)] for w in windows)


@functools.lru_cache(maxsize=16)
def _window_function(output_size, crop_fraction):
    """dataloader.fit_window over int32 [n, 2] sizes and float32 [n] multipliers at once,
    traced once per output size (fit_window needs the output size as Python ints)."""
    def one_window(args):
        size, multiplier = args
        window = dataloader.fit_window(size[0], size[1], output_size, multiplier, crop_fraction)
        return window.crop_offset, window.crop_size, window.resized_size

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32),
                                  tf.TensorSpec([None], tf.float32)])
    def windows(sizes, multipliers):
        return tf.vectorized_map(one_window, (sizes, multipliers))
    return windows


def place_boxes(box_set, output_size, multipliers):
    """Boxes of `box_set` in network-input pixels at every multiplier.

    Returns:
      (boxes float32 [K, N, 4] [ymin, xmin, ymax, xmax] clipped to the resized window,
       visible bool [K, N]: some of the box is inside the window).
    """
    offset, crop, resized = fit_windows(box_set.image_sizes, output_size, multipliers)
    image = box_set.image_index
    offset, crop, resized = (np.tile(a[image].transpose(1, 0, 2), 2) for a in (offset, crop,
                                                                               resized))
    boxes = (box_set.boxes[None] - offset) * (resized / crop)
    boxes = np.minimum(np.maximum(boxes, 0.0), resized).astype(np.float32)
    visible = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
    return boxes, visible


def level_extents(setup: AnchorSetup):
    """The anchor table per level: [(level, y_extent [h, A, 2], x_extent [w, A, 2])], extents
    (min, max) in network pixels, float32, from anchors.generate_anchor_boxes."""
    height, width = setup.output_size
    table = anchors.generate_anchor_boxes(height, width, **setup.anchor_settings())
    shapes = anchors.level_shapes(height, width, setup.min_level, setup.max_level)
    per_location = setup.anchors_per_location
    extents, start = [], 0
    for level in sorted(shapes):
        rows, columns = shapes[level]
        grid = table[start:start + rows * columns * per_location].reshape(
            rows, columns, per_location, 4)
        start += rows * columns * per_location
        extents.append((level, grid[:, 0, :, 0::2], grid[0, :, :, 1::2]))
    return extents


def _nearest(extent, centres):
    """Row of `extent` [n, A, 2] whose anchor centre is nearest each of `centres` [N]."""
    grid_centres = extent[:, 0, :].mean(axis=-1)
    return np.searchsorted((grid_centres[1:] + grid_centres[:-1]) / 2.0, centres)


def _level_best(boxes, y_extent, x_extent):
    """Best IoU [N] and its anchor index [N] of float32 boxes [N, 4] at one level."""
    ymin, xmin, ymax, xmax = (boxes[:, i:i + 1] for i in range(4))
    anchor_y = y_extent[_nearest(y_extent, (boxes[:, 0] + boxes[:, 2]) / 2.0)]   # [N, A, 2]
    anchor_x = x_extent[_nearest(x_extent, (boxes[:, 1] + boxes[:, 3]) / 2.0)]
    inter_h = np.maximum(np.minimum(ymax, anchor_y[..., 1]) - np.maximum(ymin, anchor_y[..., 0]),
                         0.0)
    inter_w = np.maximum(np.minimum(xmax, anchor_x[..., 1]) - np.maximum(xmin, anchor_x[..., 0]),
                         0.0)
    intersection = inter_h * inter_w
    anchor_area = (anchor_y[..., 1] - anchor_y[..., 0]) * (anchor_x[..., 1] - anchor_x[..., 0])
    union = (ymax - ymin) * (xmax - xmin) + anchor_area - intersection
    iou = np.divide(intersection, union, out=np.zeros_like(intersection), where=union > 0)
    best = np.argmax(iou, axis=1)
    return iou[np.arange(len(boxes)), best], best


def best_anchor_match(boxes, setup: AnchorSetup):
    """Each box's best anchor over the whole anchor table.

    Args:
      boxes: float [N, 4], [ymin, xmin, ymax, xmax] network-input pixels.
      setup: the anchors (image size, levels, scales, aspect ratios, anchor_scale).

    Returns:
      (best_iou float32 [N], level int64 [N], anchor int64 [N]: index within the location,
      octave * len(aspect_ratios) + ratio). Ties go to the lower level and anchor.
    """
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    extents = level_extents(setup)
    best_iou = np.zeros(len(boxes), np.float32)
    best_level = np.full(len(boxes), extents[0][0], np.int64)
    best_anchor = np.zeros(len(boxes), np.int64)
    for start in range(0, len(boxes), _CHUNK):
        chunk = slice(start, start + _CHUNK)
        for level, y_extent, x_extent in extents:
            iou, anchor = _level_best(boxes[chunk], y_extent, x_extent)
            better = iou > best_iou[chunk]
            best_iou[chunk] = np.where(better, iou, best_iou[chunk])
            best_level[chunk] = np.where(better, level, best_level[chunk])
            best_anchor[chunk] = np.where(better, anchor, best_anchor[chunk])
    return best_iou, best_level, best_anchor


@dataclasses.dataclass
class Placed:
    """Non-crowd boxes as training sees them, one row per (box, multiplier) left visible:
    boxes float32 [S, 4] network pixels, class_index [S], and the box's row in the BoxSet."""
    boxes: np.ndarray
    class_index: np.ndarray
    box_row: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        """sqrt(width * height) [S], network pixels."""
        return np.sqrt((self.boxes[:, 2] - self.boxes[:, 0]) * (self.boxes[:, 3] - self.boxes[:, 1]))

    @property
    def aspects(self) -> np.ndarray:
        """width / height [S]."""
        return (self.boxes[:, 3] - self.boxes[:, 1]) / (self.boxes[:, 2] - self.boxes[:, 0])


def place_for_training(box_set, setup: AnchorSetup, multipliers=None) -> Placed:
    """Non-crowd boxes at the recipe's training scales (scale_multipliers by default; pass
    [1.0] for the eval resize). Crowd boxes never become positives, so they are left out."""
    if multipliers is None:
        multipliers = scale_multipliers(setup)
    boxes, visible = place_boxes(box_set, setup.output_size, multipliers)
    keep = visible & ~box_set.is_crowd[None]
    rows = np.broadcast_to(np.arange(len(box_set.boxes)), keep.shape)[keep]
    return Placed(boxes[keep], box_set.class_index[rows], rows)


def class_coverage(best_iou, class_index, num_classes, threshold):
    """float64 [num_classes]: share of each class's boxes with best_iou >= threshold; NaN for
    a class without boxes."""
    counts = np.bincount(class_index, minlength=num_classes).astype(np.float64)
    hits = np.bincount(class_index, weights=(best_iou >= threshold).astype(np.float64),
                       minlength=num_classes)
    with np.errstate(invalid='ignore', divide='ignore'):
        return np.where(counts > 0, hits / counts, np.nan)


def search_sample(box_set, per_class=SEARCH_BOXES_PER_CLASS, seed=0):
    """At most `per_class` boxes of every class, drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    keep = []
    for class_index in range(box_set.num_classes):
        rows = np.flatnonzero(box_set.class_index == class_index)
        keep.append(rows if len(rows) <= per_class else rng.choice(rows, per_class, False))
    return box_set.subset(np.sort(np.concatenate(keep)) if keep else np.zeros(0, np.int64))


def coverage_by_class(box_set, setup):
    """float64 [num_classes] coverage at the training scales (NaN: class without boxes)."""
    train = place_for_training(box_set, setup)
    best_iou = best_anchor_match(train.boxes, setup)[0]
    return class_coverage(best_iou, train.class_index, box_set.num_classes,
                          setup.match_threshold)
