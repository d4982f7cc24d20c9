"""What `Detector.predict` accepts, turned into images: a file path, a glob, a folder, a PIL
image, a NumPy array (uint8 RGB [H, W, 3], or a batch [N, H, W, 3]) or a list of any of them.

Files are read as `inference.py predict` reads them (serving/predict.py read_rgb: any mode PIL
decodes, upright per EXIF), so both give the same detections. In-memory images are taken as
they are: a PIL image's pixels in RGB (alpha composited on black, as read_rgb does), not
rotated by its EXIF tag; an array must already be uint8 RGB.
"""
import dataclasses
import glob
import os
import pathlib

import numpy as np
from PIL import Image

from efficientdet_hpu.data import image_codec
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving.model_spec import InferenceError

ACCEPTED = ('a file path, a glob, a folder, a PIL image, a uint8 RGB NumPy array [H, W, 3] or '
            '[N, H, W, 3], or a list of them')
GLOB_CHARACTERS = ('*', '?', '[')


@dataclasses.dataclass
class Item:
    """One image to predict: a file (path, read when its turn comes) or pixels already in
    memory (uint8 [H, W, 3]); position: 1-based place in the whole input (the default COCO
    image_id of an image whose file name is not a number, as in detections.json)."""
    position: int
    path: str = None
    pixels: np.ndarray = None


def _files_of_string(text):
    """The image files a path, a folder or a glob names (a folder's and a glob's sorted)."""
    if os.path.isdir(text) or os.path.isfile(text):
        try:
            return predict.list_images(text)
        except FileNotFoundError:
            raise InferenceError('folder %s holds no image file (%s)' % (
                text, ', '.join(predict.IMAGE_EXTENSIONS))) from None
    if any(character in text for character in GLOB_CHARACTERS):
        files = sorted(path for path in glob.glob(text) if os.path.isfile(path))
        if not files:
            raise InferenceError('%s matches no file; pass an existing image, folder or glob'
                                 % text)
        return files
    raise InferenceError('%s does not exist; pass an image file, a folder of images or a glob '
                         "such as 'photos/*.jpg'" % text)


def _arrays_of(array):
    """An image array or a batch as a list of uint8 [H, W, 3] arrays."""
    if array.dtype != np.uint8 or array.ndim not in (3, 4) or array.shape[-1] != 3:
        raise InferenceError(
            'an array of shape %s and dtype %s is not an image: predict takes uint8 RGB '
            'pixels [H, W, 3] or a batch [N, H, W, 3] (0-255; e.g. np.asarray(pil_image.'
            "convert('RGB')))" % (tuple(array.shape), array.dtype))
    if 0 in array.shape[-3:-1]:
        raise InferenceError('an array of shape %s is an image without pixels; pass one of at '
                             'least 1 x 1' % (tuple(array.shape),))
    if array.ndim == 4 and not array.shape[0]:
        raise InferenceError('an array of shape %s is a batch of no image; pass at least one'
                             % (tuple(array.shape),))
    return list(array) if array.ndim == 4 else [array]


def _pixels_of_pil(image):
    return np.asarray(image_codec.to_rgb(image), dtype=np.uint8)


def expand(source):
    """A predict source -> [Item] in order; raises InferenceError naming what is wrong."""
    members = list(source) if isinstance(source, (list, tuple)) else [source]
    items = []
    for member in members:
        if isinstance(member, pathlib.PurePath):
            member = str(member)
        if isinstance(member, str):
            found = [Item(0, path=path) for path in _files_of_string(member)]
        elif isinstance(member, Image.Image):
            found = [Item(0, pixels=_pixels_of_pil(member))]
        elif isinstance(member, np.ndarray):
            found = [Item(0, pixels=pixels) for pixels in _arrays_of(member)]
        else:
            raise InferenceError('predict got a %s object; it takes %s'
                                 % (type(member).__name__, ACCEPTED))
        items.extend(found)
    if not items:
        raise InferenceError('predict got an empty list; it takes %s' % ACCEPTED)
    for position, item in enumerate(items, start=1):
        item.position = position
    return items


def read(item, any_size=False):
    """uint8 [H, W, 3] pixels of an Item (a file read as inference.py predict reads it);
    None, with the reason, for a file that cannot be decoded."""
    if item.pixels is not None:
        return item.pixels, None
    try:
        return predict.read_rgb(item.path, any_size), None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return None, '%s: %s' % (type(error).__name__, error)
