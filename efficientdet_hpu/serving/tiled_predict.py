"""Detections on a photo larger than the network input, tile by tile
(`inference.py predict --tile_size=640`).

The photo is cut into overlapping tiles (data/tiling.py: every `tile_size - overlap` pixels,
the last tile flush with the far edge), the tiles run through any predictor (SavedModel,
TFLite, ONNX, a model_dir) in batches of `batch_size`, and each tile's detections are moved
to photo pixels by adding the tile's origin. Merging across tile seams: cross-tile NMS, per
class: a detection is removed when a higher-scoring detection of the same class from another
tile overlaps it with IoU > `iou_thresh` (0.5); detections of one tile are the model's own
post-processing and are not touched again, so a photo that fits one tile gives exactly the
untiled result. At most `max_detections`, best first. Memory: the decoded photo plus one batch
of tiles and its detections.
"""
import numpy as np

from efficientdet_hpu.data import tiling
from efficientdet_hpu.ops import host_postprocess


def _tile_detections(predictor, pixels, windows, batch_size):
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
    return (np.concatenate(boxes).reshape(-1, 4), np.concatenate(scores),
            np.concatenate(classes).astype(np.int64), np.concatenate(tiles))


def cross_tile_nms(boxes, scores, classes, tiles, iou_thresh, max_detections):
    """Indices kept, best first: greedy in score order, a box suppresses later boxes of its
    class from other tiles with IoU > iou_thresh. boxes [K, 4] [ymin, xmin, ymax, xmax]."""
    order = np.argsort(-scores, kind='stable')
    kept = []
    while order.size and len(kept) < max_detections:
        best, rest = order[0], order[1:]
        kept.append(best)
        suppressed = ((host_postprocess.iou_one_to_many(boxes[best], boxes[rest]) > iou_thresh)
                      & (classes[rest] == classes[best]) & (tiles[rest] != tiles[best]))
        order = rest[~suppressed]
    return np.asarray(kept, np.int64)


def predict_tiled(predictor, pixels, tile_size, overlap, batch_size=4, iou_thresh=0.5,
                  max_detections=1000):
    """A predictor's outputs (batch of 1) for a whole photo, computed tile by tile.

    Args:
      predictor: has predict(uint8 [B, h, w, 3]) -> {'detection_boxes' [B, N, 4] input
        pixels [ymin, xmin, ymax, xmax], 'detection_scores' [B, N], 'detection_classes'
        [B, N], 'num_detections' [B]}.
      pixels: uint8 [H, W, 3], the photo.
    Returns:
      the same keys for the photo: boxes in photo pixels, [1, K, ...], K <= max_detections.
    """
    windows = tiling.tile_windows(pixels.shape[0], pixels.shape[1], tile_size, overlap)
    boxes, scores, classes, tiles = _tile_detections(predictor, pixels, windows, batch_size)
    kept = cross_tile_nms(boxes, scores, classes, tiles, iou_thresh, max_detections)
    return {'detection_boxes': boxes[kept].astype(np.float32)[None],
            'detection_scores': scores[kept].astype(np.float32)[None],
            'detection_classes': classes[kept][None],
            'num_detections': np.array([len(kept)], np.int32)}


class TiledPredictor:
    """Wraps a predictor so predict([photo]) runs predict_tiled (one photo per call)."""

    def __init__(self, predictor, tile_size, overlap, batch_size=4, iou_thresh=0.5,
                 max_detections=1000):
        tiling.axis_starts(tile_size, tile_size, overlap)  # Checks tile_size and overlap.
        self._predictor = predictor
        self._settings = dict(tile_size=tile_size, overlap=overlap, batch_size=batch_size,
                              iou_thresh=iou_thresh, max_detections=max_detections)

    def predict(self, images):
        if len(images) != 1:
            raise ValueError('TiledPredictor takes one photo per call, got %d' % len(images))
        return predict_tiled(self._predictor, images[0], **self._settings)

    def close(self):
        self._predictor.close()
