"""Turns an image file into the RGB JPEG bytes stored in a TFRecord.

Baseline RGB JPEGs keep their original bytes (no re-encode: lossless and fast). Everything else
(grayscale, CMYK, palette, alpha, 16-bit, PNG, progressive JPEG, ...) is decoded and written as
an RGB JPEG at quality 95. Alpha is composited on black. Every file is fully decoded, so
unreadable and truncated files are caught here, before they would fail mid-training.
"""
import contextlib
import io

import numpy as np
from PIL import Image, ImageFile

from efficientdet_hpu.data.coco_annotations import ConversionError

JPEG_QUALITY = 95
_ALPHA_MODES = ('RGBA', 'LA', 'PA', 'RGBa', 'La')
_EXIF_ORIENTATION_TAG = 0x0112
EXIF_TRANSPOSING = (5, 6, 7, 8)  # Orientations that swap width and height.
# The fix for a photo stored rotated whose annotations are of its upright view; the caller
# ends it with what holds them ('annotations', 'XML', 'labels').
UPRIGHT_FIX = 'save the photo upright (exiftran -ai, or PIL ImageOps.exif_transpose) and keep its '


def exif_orientation(path: str) -> int:
    """The photo's EXIF orientation, 1 (as stored) where it has none."""
    with Image.open(path) as image:
        return image.getexif().get(_EXIF_ORIENTATION_TAG, 1) or 1


def _is_baseline_rgb_jpeg(image: Image.Image) -> bool:
    return (image.format == 'JPEG' and image.mode == 'RGB'
            and not image.info.get('progressive') and not image.info.get('progression'))


def _high_bit_depth_to_rgb(image: Image.Image) -> Image.Image:
    """Scales 16-bit ('I;16*', 'I') and float ('F') grayscale to 8 bits (PIL would clip)."""
    pixels = np.asarray(image, dtype=np.float64)
    if image.mode.startswith('I;16') or (image.mode == 'I' and pixels.max(initial=0) > 255):
        pixels = pixels / 257.0  # 65535 -> 255.
    gray = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
    return Image.fromarray(gray, mode='L').convert('RGB')


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> 'RGB'. Alpha (also palette transparency) is composited on black."""
    if image.mode == 'RGB':
        return image
    if image.mode.startswith('I') or image.mode == 'F':
        return _high_bit_depth_to_rgb(image)
    if image.mode in _ALPHA_MODES or (image.mode == 'P' and 'transparency' in image.info):
        rgba = image.convert('RGBA')
        black = Image.new('RGBA', rgba.size, (0, 0, 0, 255))
        return Image.alpha_composite(black, rgba).convert('RGB')
    return image.convert('RGB')


def _size_mismatch_message(path: str, image: Image.Image, json_size, json_path: str) -> str:
    width, height = image.size
    orientation = image.getexif().get(_EXIF_ORIENTATION_TAG)
    if orientation in EXIF_TRANSPOSING and tuple(json_size) == (height, width):
        fix = (f'The file has EXIF orientation {orientation} (a 90-degree rotation): the sizes, '
               f'and so the boxes, are of the upright view, the stored pixels are not rotated. '
               f'{UPRIGHT_FIX[0].upper()}{UPRIGHT_FIX[1:]}annotations.')
    else:
        fix = (f'Boxes would be misplaced: correct the width and height of the image in '
               f'{json_path} if its boxes were drawn on these pixels, else re-export the photo '
               f'its boxes were drawn on.')
    return (f'image {path} is {width}x{height} (width x height) but {json_path} says '
            f'{json_size[0]}x{json_size[1]}. {fix}')


def _decode(path: str, json_width: int, json_height: int, json_path: str, keep_jpeg: bool):
    """(original bytes when keep_jpeg and the file is a baseline RGB JPEG, else None;
    the RGB image, or None when the bytes are kept)."""
    # Truncated files must fail loudly; a partial image with grey rows would be silent damage.
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    with open(path, 'rb') as handle:
        data = handle.read()
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.size != (json_width, json_height):
                raise ConversionError(
                    _size_mismatch_message(path, image, (json_width, json_height), json_path))
            image.load()
            if keep_jpeg and _is_baseline_rgb_jpeg(image):
                return data, None
            rgb = to_rgb(image)
            rgb.load()
            return None, rgb
    except ConversionError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ConversionError(f'cannot decode image {path} ({type(error).__name__}: {error}); '
                              f'the file is unreadable or truncated. Re-export or remove it '
                              f'from {json_path}.') from None


# The photo the last tile was cut from, decoded: {(path, width, height): RGB image}. The tiles
# of a photo reach a shard writer one after another, so each writer decodes a photo once, not
# once per tile (a 10k x 10k orthophoto has 1,600 tiles of 320 px).
_TILE_SOURCE = {}


@contextlib.contextmanager
def any_pixel_count(lifted=True):
    """Within it (when `lifted`), PIL reads images past its decompression-bomb guard (89M
    pixels warns, 179M refuses): tiling is for orthophotos of that size. The limit is
    restored afterwards for every other reader."""
    limit = Image.MAX_IMAGE_PIXELS
    if lifted:
        Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _tile_source(path: str, json_width: int, json_height: int, json_path: str):
    key = (path, json_width, json_height)
    if key not in _TILE_SOURCE:
        _TILE_SOURCE.clear()
        with any_pixel_count():
            _TILE_SOURCE[key] = _decode(path, json_width, json_height, json_path, False)[1]
    return _TILE_SOURCE[key]


def encode_jpeg(path: str, json_width: int, json_height: int, json_path: str,
                window=None) -> bytes:
    """Reads `path`, checks it decodes fully at the JSON's size; returns RGB JPEG bytes.

    window: (y0, x0, y1, x1) pixels to keep (a tile, always re-encoded), or None.

    Raises:
        ConversionError: unreadable/truncated file or a size that differs from the JSON.
    """
    if window is None:
        data, rgb = _decode(path, json_width, json_height, json_path, True)
        if data is not None:
            return data
    else:
        y0, x0, y1, x1 = window
        rgb = _tile_source(path, json_width, json_height, json_path).crop((x0, y0, x1, y1))
    output = io.BytesIO()
    rgb.save(output, format='JPEG', quality=JPEG_QUALITY)
    return output.getvalue()
