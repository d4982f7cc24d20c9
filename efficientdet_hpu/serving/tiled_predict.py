"""Detections on a photo larger than the network input, tile by tile
(`inference.py predict --tile_size=640`).

The photo is cut into overlapping tiles (data/tiling.py: every `tile_size - overlap` pixels,
the last tile flush with the far edge), the tiles run through any predictor (SavedModel,
TFLite, ONNX, a model_dir) in batches of `batch_size`, and each tile's detections are moved
to photo pixels by adding the tile's origin. Merging across tile seams: cross-tile NMS, per
class: a detection is removed when a higher-scoring detection of the same class from another
tile overlaps it with IoU > `iou_thresh` (0.5); detections of one tile are the model's own
post-processing and are not touched again, so a photo that fits one tile gives exactly the
untiled result. Only detections of tiles that share pixels are compared, so the merge grows
with the photo, not with its square; every surviving detection is kept (no cap unless
`max_detections` is given), best first: a whole orthophoto holds tens of thousands of trees.
Memory: the decoded photo plus one batch of tiles and the detections.
"""
import numpy as np

from efficientdet_hpu.data import tiling
from efficientdet_hpu.ops import host_postprocess


def _tile_detections(predictor, pixels, windows, batch_size, on_tiles=None):
    """Photo-pixel boxes [K, 4], scores [K], classes [K] and tile index [K] of all tiles."""
    boxes, scores, classes, tiles = [], [], [], []
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        crops = np.stack([pixels[w.y0:w.y1, w.x0:w.x1] for w in batch])
        outputs = predictor.predict(crops)
        for offset, window in enumerate(batch):
            count = int(outputs['num_detections'][offset])
            boxes.append(tiling.to_photo(outputs['detection_boxes'][offset][:count], window))
            scores.append(outputs['detection_scores'][offset][:count])
            classes.append(outputs['detection_classes'][offset][:count])
            tiles.append(np.full(count, start + offset))
        if on_tiles is not None:
            on_tiles(len(batch), len(windows))
    return (np.concatenate(boxes).reshape(-1, 4), np.concatenate(scores),
            np.concatenate(classes).astype(np.int64), np.concatenate(tiles))


def _seam_neighbours(boxes, classes, tiles, tile_pairs, iou_thresh):
    """For each detection, the detections of other tiles it would suppress or be suppressed
    by (same class, IoU > iou_thresh), as CSR (offsets [K + 1], neighbours); only detections of
    tiles that share pixels (tile_pairs) are compared."""
    by_tile = np.argsort(tiles, kind='stable')
    bounds = np.searchsorted(tiles[by_tile], np.arange(int(tiles.max(initial=-1)) + 2))
    sources, targets = [], []
    for a, b in tile_pairs.tolist():
        if max(a, b) + 1 >= len(bounds):
            continue
        in_a, in_b = by_tile[bounds[a]:bounds[a + 1]], by_tile[bounds[b]:bounds[b + 1]]
        if not in_a.size or not in_b.size:
            continue
        hits = ((host_postprocess.iou_many_to_many(boxes[in_a], boxes[in_b]) > iou_thresh)
                & (classes[in_a][:, None] == classes[in_b][None, :]))
        rows, cols = np.nonzero(hits)
        sources += [in_a[rows], in_b[cols]]
        targets += [in_b[cols], in_a[rows]]
    sources = np.concatenate(sources) if sources else np.zeros(0, np.int64)
    targets = np.concatenate(targets) if targets else np.zeros(0, np.int64)
    order = np.argsort(sources, kind='stable')
    offsets = np.searchsorted(sources[order], np.arange(len(tiles) + 1))
    return offsets, targets[order]


def cross_tile_nms(boxes, scores, classes, tiles, tile_pairs, iou_thresh, max_detections=None):
    """Indices kept, best first: greedy in score order, a kept box suppresses the lower-scoring
    boxes of its class from other tiles with IoU > iou_thresh. boxes [K, 4] [ymin, xmin, ymax,
    xmax]; tiles [K] the tile of each box; tile_pairs [P, 2] the tiles that share pixels (only
    their boxes can overlap). Linear in the boxes of a photo, so a 10k x 10k orthophoto with
    tens of thousands of objects merges in seconds; max_detections None keeps all."""
    offsets, neighbours = _seam_neighbours(boxes, classes, tiles, tile_pairs, iou_thresh)
    suppressed = np.zeros(len(scores), bool)
    kept = []
    for index in np.argsort(-scores, kind='stable').tolist():
        if suppressed[index]:
            continue
        kept.append(index)
        if max_detections is not None and len(kept) >= max_detections:
            break
        # Neighbours scored higher are already decided: kept ones would have suppressed this
        # box, so they are all suppressed ones; marking them again changes nothing.
        suppressed[neighbours[offsets[index]:offsets[index + 1]]] = True
    return np.asarray(kept, np.int64)


def predict_tiled(predictor, pixels, tile_size, overlap, batch_size=4, iou_thresh=0.5,
                  max_detections=None, on_tiles=None):
    """A predictor's outputs (batch of 1) for a whole photo, computed tile by tile.

    Args:
      predictor: has predict(uint8 [B, h, w, 3]) -> {'detection_boxes' [B, N, 4] input
        pixels [ymin, xmin, ymax, xmax], 'detection_scores' [B, N], 'detection_classes'
        [B, N], 'num_detections' [B]}.
      pixels: uint8 [H, W, 3], the photo.
      max_detections: cap on the merged list (None: every detection that survives the merge;
        each tile already gives at most the model's own cap).
      on_tiles: called as on_tiles(tiles just predicted, the photo's tiles) after each batch.
    Returns:
      the same keys for the photo: boxes in photo pixels, [1, K, ...].
    """
    height, width = pixels.shape[:2]
    windows = tiling.tile_windows(height, width, tile_size, overlap)
    boxes, scores, classes, tiles = _tile_detections(predictor, pixels, windows, batch_size,
                                                     on_tiles)
    kept = cross_tile_nms(boxes, scores, classes, tiles,
                          tiling.overlapping_pairs(height, width, tile_size, overlap),
                          iou_thresh, max_detections)
    return {'detection_boxes': boxes[kept].astype(np.float32)[None],
            'detection_scores': scores[kept].astype(np.float32)[None],
            'detection_classes': classes[kept][None],
            'num_detections': np.array([len(kept)], np.int32)}


class TiledPredictor:
    """Wraps a predictor so predict([photo]) runs predict_tiled (one photo per call)."""

    def __init__(self, predictor, tile_size, overlap, batch_size=4, iou_thresh=0.5,
                 max_detections=None):
        tiling.axis_starts(tile_size, tile_size, overlap)  # Checks tile_size and overlap.
        self._predictor = predictor
        self.on_tiles = None  # predict_tiled's, for a progress line of a large photo.
        self._settings = dict(tile_size=tile_size, overlap=overlap, batch_size=batch_size,
                              iou_thresh=iou_thresh, max_detections=max_detections)

    def predict(self, images):
        if len(images) != 1:
            raise ValueError('TiledPredictor takes one photo per call, got %d' % len(images))
        return predict_tiled(self._predictor, images[0], on_tiles=self.on_tiles,
                             **self._settings)

    def close(self):
        self._predictor.close()
