"""Reads, validates and indexes a COCO instances JSON into per-image box lists.

Pure Python (no TensorFlow, no flags): everything here runs before any output is written, so
a broken annotation file fails fast with a message that names the file and the entry.
COCO boxes are [x, y, width, height] in pixels; the output boxes are
[ymin, xmin, ymax, xmax] normalised to [0, 1].
"""
import collections
import dataclasses
import json
import math
import os
from typing import Dict, List, Optional, Tuple

from efficientdet_hpu.core.errors import UserError

REQUIRED_KEYS = ('images', 'annotations', 'categories')
SKIP_REASONS = ('malformed', 'degenerate', 'outside', 'crowd')


class ConversionError(UserError):
    """A problem with the user's input data; the message says which file, which entry, and why."""


@dataclasses.dataclass
class ImageRecord:
    """One image to write. Box fields are parallel lists of length N (N may be 0)."""
    image_id: int
    file_name: str
    path: str
    width: int
    height: int
    boxes: List[Tuple[float, float, float, float]]  # [ymin, xmin, ymax, xmax], normalised.
    labels: List[int]  # Contiguous 1..num_classes.
    names: List[str]
    is_crowd: List[int]
    areas: List[float]  # Original image pixels.
    # A tile of a larger photo (data/tiling.py): (y0, x0, y1, x1) in the photo's pixels, and
    # the photo's image id; None for a whole image.
    tile: Optional[Tuple[int, int, int, int]] = None
    source_id: Optional[int] = None
    photo_size: Optional[Tuple[int, int]] = None  # The photo's (height, width), for a tile.


@dataclasses.dataclass
class BoxStats:
    """Counts of what happened to each annotation."""
    skipped: Dict[str, int] = dataclasses.field(
        default_factory=lambda: {reason: 0 for reason in SKIP_REASONS})
    clipped: int = 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def json_error(path: str, error: json.JSONDecodeError) -> str:
    """'path:LINE:COL: not valid JSON: <the parser's message>; <the fix>', the position as
    editors and compilers print it; a file that ends where the parser stopped was cut short."""
    cut = (error.pos >= len(error.doc.rstrip())
           or error.msg.startswith('Unterminated string'))  # It runs to the end of the file.
    message = error.msg[:-3] + ' here' if error.msg.endswith(' at') else error.msg
    return '%s:%d:%d: not valid JSON: %s; %s' % (
        path, error.lineno, error.colno, message,
        'the file ends there, cut short (an interrupted download or copy?): get it again'
        if cut else 'fix the file there')


def load_coco_json(json_path: str) -> dict:
    """Loads the JSON; checks it is an object with list-valued images/annotations/categories."""
    try:
        with open(json_path, 'rb') as handle:
            content = json.load(handle)
    except FileNotFoundError:
        raise ConversionError(f'--object_annotations_file={json_path} does not exist.') from None
    except json.JSONDecodeError as error:
        raise ConversionError(json_error(json_path, error)) from None
    except UnicodeDecodeError as error:
        raise ConversionError(f'{json_path} is not UTF-8 text JSON ({error}).') from None
    if not isinstance(content, dict):
        raise ConversionError(f'{json_path}: the top level must be a JSON object with the keys '
                              f'{list(REQUIRED_KEYS)}, got a {type(content).__name__}.')
    missing = [key for key in REQUIRED_KEYS if key not in content]
    if missing:
        raise ConversionError(f'{json_path} lacks the top-level key(s) {missing}; a COCO '
                              f'instances file has {list(REQUIRED_KEYS)}.')
    for key in REQUIRED_KEYS:
        if not isinstance(content[key], list):
            raise ConversionError(f'{json_path}: "{key}" must be a list, got a '
                                  f'{type(content[key]).__name__}.')
    return content


def index_images(images: list, json_path: str) -> Dict[int, dict]:
    """Returns {image id: image entry}, in JSON order; checks ids, sizes, file names."""
    images_by_id = {}
    for index, image in enumerate(images):
        where = f'{json_path}: images[{index}]'
        if not isinstance(image, dict):
            raise ConversionError(f'{where} must be an object, got {image!r}.')
        if not _is_int(image.get('id')):
            raise ConversionError(f'{where} has no integer "id" (got {image.get("id")!r}).')
        if not isinstance(image.get('file_name'), str) or not image['file_name']:
            raise ConversionError(f'{where} (id {image["id"]}) has no "file_name".')
        for key in ('width', 'height'):
            if not _is_int(image.get(key)) or image[key] <= 0:
                raise ConversionError(f'{where} ({image["file_name"]!r}) needs a positive integer '
                                      f'"{key}", got {image.get(key)!r}.')
        if image['id'] in images_by_id:
            raise ConversionError(
                f'{where} ({image["file_name"]!r}) repeats image id {image["id"]}, already used '
                f'by {images_by_id[image["id"]]["file_name"]!r}; image ids must be unique.')
        images_by_id[image['id']] = image
    return images_by_id


def index_categories(categories: list, json_path: str) -> Dict[int, dict]:
    """Returns {category id: category entry}; ids may be any distinct integers."""
    categories_by_id = {}
    for index, category in enumerate(categories):
        where = f'{json_path}: categories[{index}]'
        if (not isinstance(category, dict) or not _is_int(category.get('id'))
                or not isinstance(category.get('name'), str)):
            raise ConversionError(f'{where} = {category!r} needs an integer "id" and a string '
                                  f'"name".')
        if category['id'] in categories_by_id:
            raise ConversionError(f'{where} repeats category id {category["id"]}.')
        categories_by_id[category['id']] = category
    if not categories_by_id:
        raise ConversionError(f'{json_path}: "categories" is empty; nothing to train on.')
    return categories_by_id


def group_annotations(annotations: list, images_by_id: dict, categories_by_id: dict,
                      json_path: str) -> Dict[int, List[dict]]:
    """Returns {image id: [annotation, ...]}; every image_id/category_id must be known."""
    grouped = collections.defaultdict(list)
    for index, annotation in enumerate(annotations):
        where = f'{json_path}: annotations[{index}]'
        if not isinstance(annotation, dict):
            raise ConversionError(f'{where} must be an object, got {annotation!r}.')
        where += f' (id {annotation.get("id")!r})'
        image_id, category_id = annotation.get('image_id'), annotation.get('category_id')
        if not _is_int(image_id) or image_id not in images_by_id:
            raise ConversionError(f'{where} refers to image_id {image_id!r}, which is not in '
                                  f'"images".')
        if not _is_int(category_id) or category_id not in categories_by_id:
            raise ConversionError(f'{where} refers to category_id {category_id!r}, which is not '
                                  f'in "categories" (known ids: {sorted(categories_by_id)}).')
        grouped[image_id].append(annotation)
    return grouped


def check_image_files(images_by_id: dict, image_dir: str, json_path: str) -> None:
    """Raises ConversionError naming the first image that is missing under image_dir."""
    missing = [image['file_name'] for image in images_by_id.values()
               if not os.path.isfile(os.path.join(image_dir, image['file_name']))]
    if missing:
        more = f' ({len(missing)} of {len(images_by_id)} images are missing)' if len(
            missing) > 1 else ''
        raise ConversionError(f'image {missing[0]!r} listed in {json_path} does not exist under '
                              f'--image_dir={image_dir}{more}.')


def clip_box(bbox, width: int, height: int):
    """COCO [x, y, w, h] pixels -> ([ymin, xmin, ymax, xmax] pixels clipped, status).

    status is 'ok', 'clipped' (kept), or a reason the box is dropped: 'malformed',
    'degenerate' (w or h <= 0) or 'outside' (no part inside the image); the box is then None.
    """
    if (not isinstance(bbox, (list, tuple)) or len(bbox) != 4
            or not all(_is_number(value) for value in bbox)):
        return None, 'malformed'
    x, y, box_width, box_height = (float(value) for value in bbox)
    if box_width <= 0 or box_height <= 0:
        return None, 'degenerate'
    clipped = (max(y, 0.0), max(x, 0.0), min(y + box_height, float(height)),
               min(x + box_width, float(width)))
    if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
        return None, 'outside'
    status = 'ok' if clipped == (y, x, y + box_height, x + box_width) else 'clipped'
    return clipped, status


def make_record(image: dict, annotations: List[dict], image_dir: str, categories_by_id: dict,
                category_id_to_label: dict, include_crowd: bool, stats: BoxStats) -> ImageRecord:
    """Validates one image's annotations into an ImageRecord, counting skips in `stats`."""
    width, height = image['width'], image['height']
    record = ImageRecord(image['id'], image['file_name'],
                         os.path.join(image_dir, image['file_name']), width, height,
                         [], [], [], [], [])
    for annotation in annotations:
        is_crowd = int(bool(annotation.get('iscrowd', 0)))
        if is_crowd and not include_crowd:
            stats.skipped['crowd'] += 1
            continue
        box, status = clip_box(annotation.get('bbox'), width, height)
        area = annotation.get('area')
        if box is not None and area is not None and (not _is_number(area) or area < 0):
            box, status = None, 'malformed'
        if box is None:
            stats.skipped[status] += 1
            continue
        stats.clipped += status == 'clipped'
        ymin, xmin, ymax, xmax = box
        record.boxes.append((ymin / height, xmin / width, ymax / height, xmax / width))
        record.labels.append(category_id_to_label[annotation['category_id']])
        record.names.append(categories_by_id[annotation['category_id']]['name'])
        record.is_crowd.append(is_crowd)
        record.areas.append(float(area) if area is not None else (ymax - ymin) * (xmax - xmin))
    return record


def read_dataset(json_path: str, image_dir: str, category_id_to_label=None,
                 include_crowd: bool = True):
    """Loads and validates everything; returns (records in JSON order, categories, BoxStats).

    `category_id_to_label` defaults to labels 1..N in ascending category-id order.
    """
    content = load_coco_json(json_path)
    images_by_id = index_images(content['images'], json_path)
    categories_by_id = index_categories(content['categories'], json_path)
    grouped = group_annotations(content['annotations'], images_by_id, categories_by_id, json_path)
    check_image_files(images_by_id, image_dir, json_path)
    if category_id_to_label is None:
        category_id_to_label = {category_id: label + 1
                                for label, category_id in enumerate(sorted(categories_by_id))}
    stats = BoxStats()
    records = [make_record(image, grouped.get(image_id, []), image_dir, categories_by_id,
                           category_id_to_label, include_crowd, stats)
               for image_id, image in images_by_id.items()]
    return records, list(categories_by_id.values()), stats
