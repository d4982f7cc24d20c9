"""The numbers a fine-tune's plan is made from: each photo's size and boxes, and what tiling
them would give. Plain Python and NumPy over COCO dicts (no TensorFlow)."""
import dataclasses
import math
from typing import Sequence, Tuple

import numpy as np

from efficientdet_hpu.data import tiling


@dataclasses.dataclass(frozen=True)
class Photo:
    """A photo's pixel size and its boxes, COCO [x, y, w, h] pixels (crowd boxes left out)."""
    width: int
    height: int
    boxes: Tuple[Tuple[float, float, float, float], ...] = ()

    @property
    def long_side(self) -> int:
        return max(self.width, self.height)


@dataclasses.dataclass(frozen=True)
class DataStats:
    """The training and validation photos and the class count."""
    train: Tuple[Photo, ...]
    val: Tuple[Photo, ...]
    num_classes: int

    @property
    def train_boxes(self) -> int:
        return sum(len(photo.boxes) for photo in self.train)

    @property
    def val_boxes(self) -> int:
        return sum(len(photo.boxes) for photo in self.val)


def photos_of(coco) -> Tuple[Photo, ...]:
    """The Photos of a COCO dict, in its image order."""
    boxes = {image['id']: [] for image in coco['images']}
    for annotation in coco['annotations']:
        x, y, w, h = (float(v) for v in annotation['bbox'])
        if not annotation.get('iscrowd') and w > 0 and h > 0:
            boxes[annotation['image_id']].append((x, y, w, h))
    return tuple(Photo(int(image['width']), int(image['height']), tuple(boxes[image['id']]))
                 for image in coco['images'])


def from_coco(train, val) -> DataStats:
    return DataStats(photos_of(train), photos_of(val), len(train['categories']))


def count(number, singular, plural=None) -> str:
    """'1 photo', '2,410 boxes'."""
    return '{:,} {}'.format(number, singular if number == 1 else plural or singular + 's')


def median(values: Sequence[float], default=0.0) -> float:
    return float(np.median(values)) if len(values) else default


def percentile(values: Sequence[float], q, default=0.0) -> float:
    return float(np.percentile(values, q)) if len(values) else default


def box_sides(photos) -> list:
    """sqrt(w h) of every box, photo pixels."""
    return [math.sqrt(w * h) for photo in photos for _, _, w, h in photo.boxes]


def box_long_sides(photos) -> list:
    return [max(w, h) for photo in photos for _, _, w, h in photo.boxes]


def sides_at_input(photos, image_size) -> list:
    """sqrt(w h) of every box once its whole photo is resized to fit image_size (the network
    input, as the input pipeline resizes: the long side to image_size)."""
    return [math.sqrt(w * h) * image_size / photo.long_side
            for photo in photos for _, _, w, h in photo.boxes]


def photo_sides_by_box(photos) -> list:
    """The long side of the photo of every box: the photo sizes weighted by their boxes."""
    return [photo.long_side for photo in photos for _ in photo.boxes]


def tile_count(photos, tile, overlap) -> int:
    """Tiles the converter cuts from the photos (data/tiling.py; empty tiles included)."""
    return sum(len(tiling.tile_windows(p.height, p.width, tile, overlap)) for p in photos)


def most_boxes_per_image(photos, tile=0, overlap=0) -> int:
    """The most boxes one training image holds: a photo, or with `tile` a tile of one (the
    converter's sliver rule, data/tiling.py)."""
    most = 0
    for photo in photos:
        if not tile:
            most = max(most, len(photo.boxes))
            continue
        yxyx = np.array([(y, x, y + h, x + w) for x, y, w, h in photo.boxes],
                        np.float64).reshape(-1, 4)
        for window in tiling.tile_windows(photo.height, photo.width, tile, overlap):
            most = max(most, len(tiling.boxes_in_tile(yxyx, window)[1]))
    return most


def tiles_coco(coco, tile, overlap) -> dict:
    """The tiles the converter cuts from a COCO dict's photos, as a COCO dict (boxes in tile
    pixels, kept by the converter's sliver rule): what the data doctor measures when the
    training images are tiles."""
    boxes = {image['id']: [] for image in coco['images']}
    for annotation in coco['annotations']:
        if not annotation.get('iscrowd'):
            boxes[annotation['image_id']].append(annotation)
    images, annotations = [], []
    for image in coco['images']:
        rows = boxes[image['id']]
        yxyx = np.array([(a['bbox'][1], a['bbox'][0], a['bbox'][1] + a['bbox'][3],
                          a['bbox'][0] + a['bbox'][2]) for a in rows], np.float64).reshape(-1, 4)
        for window in tiling.tile_windows(image['height'], image['width'], tile, overlap):
            tile_id = len(images) + 1
            images.append({'id': tile_id, 'file_name': '%s#tile-y%d-x%d' % (
                image['file_name'], window.y0, window.x0),
                'width': window.x1 - window.x0, 'height': window.y1 - window.y0})
            kept, indices = tiling.boxes_in_tile(yxyx, window)
            for (y0, x0, y1, x1), index in zip(kept.tolist(), indices.tolist()):
                annotations.append({'id': len(annotations) + 1, 'image_id': tile_id,
                                    'category_id': rows[index]['category_id'], 'iscrowd': 0,
                                    'bbox': [x0, y0, x1 - x0, y1 - y0],
                                    'area': (x1 - x0) * (y1 - y0)})
    return {'images': images, 'annotations': annotations, 'categories': coco['categories']}
