"""One image's detections as `Detector.predict` returns them: NumPy arrays in the order
torchvision and Ultralytics users expect (boxes as pixel x1, y1, x2, y2), the class names, the
source, a drawing (serving/visualize.py, as `inference.py predict` draws) and COCO-results
rows (serving/predict.py coco_rows, as detections.json holds them).
"""
import os

import numpy as np
from PIL import Image

from efficientdet_hpu.core.errors import InferenceError
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import visualize

DEFAULT_DRAW_SCORE = 0.0  # draw(): every detection the result holds (it is already filtered).


class Detections:
    """The detections of one image, best first.

    Attributes:
      boxes: float32 [N, 4], pixels of the image, [x1, y1, x2, y2] (x right, y down).
      scores: float32 [N], descending.
      class_ids: int64 [N], the dataset's category ids (as in its COCO JSON / label map).
      class_names: list of N str (the label map's names; the id as text without one).
      names: {category_id: name} of the model (empty without a label map).
      path: the image file, or None for an image given in memory.
      width, height: the image's size in pixels (upright, as predicted).
      position: 1-based place of the image in predict's input.
    """

    def __init__(self, boxes_yxyx, scores, class_ids, names, width, height, path=None,
                 position=1, pixels=None, any_size=False):
        boxes_yxyx = np.asarray(boxes_yxyx, np.float32).reshape(-1, 4)
        self.boxes = boxes_yxyx[:, [1, 0, 3, 2]]
        self.scores = np.asarray(scores, np.float32).reshape(-1)
        self.class_ids = np.asarray(class_ids, np.int64).reshape(-1)
        self.names = dict(names)
        self.class_names = [self.names.get(int(c), str(int(c))) for c in self.class_ids]
        self.width, self.height = int(width), int(height)
        self.path, self.position = path, position
        self._pixels, self._any_size = pixels, any_size

    def __len__(self):
        return len(self.scores)

    def __repr__(self):
        shown = ', '.join('%s %.2f' % (name, score)
                          for name, score in zip(self.class_names[:5], self.scores[:5]))
        return '<Detections %s %dx%d: %d [%s%s]>' % (
            self.path or 'in-memory image', self.width, self.height, len(self), shown,
            ', ...' if len(self) > 5 else '')

    def image(self):
        """The image predicted, PIL RGB (a file is read again, as predict read it)."""
        pixels = self._pixels
        if pixels is None:
            pixels = predict.read_rgb(self.path, self._any_size)
        return Image.fromarray(pixels)

    def draw(self, min_score=DEFAULT_DRAW_SCORE, image=None):
        """A PIL RGB copy of the image (or of `image`, same size) with each detection scoring
        at least min_score outlined and tagged "name 0.87" in its class colour."""
        return visualize.draw_detections(
            self.image() if image is None else image, self.boxes[:, [1, 0, 3, 2]], self.scores,
            self.class_ids, self.names, min_score=min_score)

    def plot(self, min_score=DEFAULT_DRAW_SCORE):
        """draw() as a uint8 RGB array [H, W, 3] (for matplotlib's imshow)."""
        return np.asarray(self.draw(min_score))

    def save(self, path, min_score=DEFAULT_DRAW_SCORE):
        """Writes draw() to `path` (format from its extension: .jpg, .png, ...); returns path."""
        path = os.fspath(path)
        written = Image.registered_extensions().get(os.path.splitext(path)[1].lower())
        if written not in Image.SAVE:
            raise InferenceError('save(%r): name an image file PIL can write, such as '
                                 "'photo.jpg' or 'photo.png'" % path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        visualize.save_image(self.draw(min_score), path)
        return path

    def to_coco(self, image_id=None):
        """COCO-results rows, as `inference.py predict` writes them to detections.json:
        {"image_id", "file_name" (files only), "category_id", "bbox": [x, y, width, height]
        (pixels, rounded to 0.01), "score" (rounded to 1e-6), "category_name" (with a label
        map)}. image_id defaults to detections.json's: the file name's number when it is one
        (000000139.jpg -> 139), else the image's 1-based place in predict's input."""
        if image_id is None:
            image_id = (predict.image_id_for(self.path, self.position) if self.path
                        else self.position)
        outputs = {'detection_boxes': self.boxes[None][:, :, [1, 0, 3, 2]],
                   'detection_scores': self.scores[None],
                   'detection_classes': self.class_ids[None],
                   'num_detections': np.array([len(self)])}
        file_name = os.path.basename(self.path) if self.path else None
        rows = predict.coco_rows(image_id, file_name, outputs, self.names)
        if file_name is None:
            for row in rows:
                del row['file_name']
        return rows
