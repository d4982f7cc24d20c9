"""Tiles of a large photograph and the boxes each tile holds (plain NumPy, no TensorFlow).

Geometry, per axis: tiles of `tile` pixels start every `tile - overlap` pixels from 0; when the
last regular tile stops short of the far edge, one more tile is placed flush with that edge
(so every pixel is covered and no tile is cut short: the last two overlap by more than
`overlap`). An axis no longer than `tile` is one tile of the whole length.

Boxes ([ymin, xmin, ymax, xmax] photo pixels) are clipped to each tile. The sliver rule: a
clipped box is kept in a tile when at least `min_visible` (default 0.5) of its area lies inside
the tile and both clipped sides are at least `min_side` (default 2) pixels; otherwise it is left
out of that tile. With an overlap at least as large as the objects, every box is whole in some
tile. Kept boxes are in tile pixels; a tile's origin (y0, x0) maps them back by adding it.
"""
import collections

import numpy as np

Window = collections.namedtuple('Window', ['y0', 'x0', 'y1', 'x1'])  # Pixels, end exclusive.


def axis_starts(length, tile, overlap):
    """Start offsets along one axis (see the module docstring)."""
    if tile <= 0 or not 0 <= overlap < tile:
        raise ValueError('need tile > 0 and 0 <= overlap < tile, got tile=%s overlap=%s'
                         % (tile, overlap))
    if length <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, length - tile + 1, stride))
    if starts[-1] + tile < length:
        starts.append(length - tile)
    return starts


def tile_windows(height, width, tile, overlap):
    """Windows covering a height x width photo, row by row (y outer)."""
    return [Window(y0, x0, min(y0 + tile, height), min(x0 + tile, width))
            for y0 in axis_starts(height, tile, overlap)
            for x0 in axis_starts(width, tile, overlap)]


def _axis_overlaps(length, tile, overlap):
    """Pairs (i, j), i <= j, of tiles along one axis whose pixel ranges overlap."""
    starts = axis_starts(length, tile, overlap)
    ends = [min(start + tile, length) for start in starts]
    return [(i, j) for i in range(len(starts)) for j in range(i, len(starts))
            if starts[j] < ends[i]]


def overlapping_pairs(height, width, tile, overlap):
    """int [P, 2] pairs (a, b), a < b, of indices into tile_windows(...) whose windows share
    pixels: the tiles whose detections can be duplicates of each other. Grows with the number
    of tiles (about 4 per tile), not with its square."""
    columns = len(axis_starts(width, tile, overlap))
    pairs = set()
    for row_a, row_b in _axis_overlaps(height, tile, overlap):
        for col_a, col_b in _axis_overlaps(width, tile, overlap):
            for a, b in ((row_a * columns + col_a, row_b * columns + col_b),
                         (row_a * columns + col_b, row_b * columns + col_a)):
                if a != b:
                    pairs.add((min(a, b), max(a, b)))
    return np.array(sorted(pairs), np.int64).reshape(-1, 2)


def boxes_in_tile(boxes, window, min_visible=0.5, min_side=2.0):
    """The boxes a tile keeps under the sliver rule.

    Args:
      boxes: float [N, 4] [ymin, xmin, ymax, xmax] photo pixels (N may be 0).
      window: a Window.
    Returns:
      (float64 [K, 4] kept boxes clipped to the tile, in tile pixels; int [K] their indices).
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    low = np.array([window.y0, window.x0, window.y0, window.x0], np.float64)
    high = np.array([window.y1, window.x1, window.y1, window.x1], np.float64)
    clipped = np.clip(boxes, low, high)
    heights, widths = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    visible = np.where(areas > 0, heights * widths / np.maximum(areas, 1e-12), 0.0)
    keep = np.flatnonzero((visible >= min_visible) & (heights >= min_side)
                          & (widths >= min_side))
    return clipped[keep] - low, keep


def to_photo(boxes, window):
    """Tile-pixel boxes [K, 4] -> photo pixels (adds the tile origin)."""
    origin = np.array([window.y0, window.x0, window.y0, window.x0], np.float64)
    return np.asarray(boxes, np.float64).reshape(-1, 4) + origin


def split_record(record, tile, overlap, min_visible=0.5, min_side=2.0, first_id=1):
    """One coco_annotations.ImageRecord of a photo -> one ImageRecord per tile.

    Tiles get image ids first_id, first_id + 1, ...; their file_name is the photo's plus
    '#tile-y<y0>-x<x0>', `tile` its window and `source_id` the photo's id. Boxes are normalised
    to the tile and their areas are the clipped boxes' pixel areas.
    Returns (tile records, number of the photo's boxes that no tile kept).
    """
    scale = np.array([record.height, record.width] * 2, np.float64)
    boxes = np.asarray(record.boxes, np.float64).reshape(-1, 4) * scale
    tiles, kept_anywhere = [], set()
    for offset, window in enumerate(tile_windows(record.height, record.width, tile, overlap)):
        kept, indices = boxes_in_tile(boxes, window, min_visible, min_side)
        kept_anywhere.update(indices.tolist())
        height, width = window.y1 - window.y0, window.x1 - window.x0
        tiles.append(type(record)(
            first_id + offset, '%s#tile-y%d-x%d' % (record.file_name, window.y0, window.x0),
            record.path, width, height,
            [tuple(box) for box in (kept / [height, width, height, width]).tolist()],
            [record.labels[i] for i in indices], [record.names[i] for i in indices],
            [record.is_crowd[i] for i in indices],
            [float((b[2] - b[0]) * (b[3] - b[1])) for b in kept],
            tile=tuple(window), source_id=record.image_id,
            photo_size=(record.height, record.width)))
    return tiles, len(boxes) - len(kept_anywhere)
