"""What a fine-tune's --data folder holds, read into one COCO instances dict, and the split
into training and validation photos.

Formats, told apart by the folder's contents (one of them, or the run stops with one line
naming what was found and what is expected):
  COCO        a .json with images/annotations/categories (at the top or in annotations/), or
              --data naming that file; the images beside it, in images/ or one folder up
  Pascal VOC  .xml files (at the top or in Annotations/), each naming its image (beside it,
              in JPEGImages/ or images/); images without an XML are not used
  YOLO        images/ (+ labels/) with the class names in classes.txt, obj.names or an
              Ultralytics data.yaml (whose val: directory, when it has one, is the validation);
              images without a label file or with an empty one are negatives (counted); a
              label file without an image is an error unless --drop_orphan_labels
A .json that does not parse is named with the parser's line and column (unless the folder is
plainly VOC or YOLO). Each is read and checked with the project's converters
(datatools/voc_to_coco.py, datatools/yolo_to_coco.py, data/coco_annotations.py), so a bad file
stops the run with their one-line errors, before anything is written.

The split, without --val_data: by photo, never by tile (tiles of one photo on both sides would
leak), deterministic from the file names (sha1 of each name, so adding a photo moves no other
photo): VAL_FRACTION of the photos, at least one and at most VAL_MAX, held out whole;
--val_photos=NAME,... names them instead.
"""
import dataclasses
import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence

import yaml

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.data import coco_annotations
from efficientdet_hpu.datatools import voc_to_coco
from efficientdet_hpu.datatools import yolo_to_coco
from efficientdet_hpu.finetune import stats

VAL_FRACTION = 0.2  # Ultralytics' and most tutorials' 80/20.
VAL_MAX = 500  # Photos: each evaluation during training predicts all of them.
NAMES_FILES = ('classes.txt', 'obj.names', 'data.yaml', 'data.yml')
IMAGE_EXTENSIONS = yolo_to_coco.IMAGE_EXTENSIONS


class InputError(UserError):
    """A --data or --val_data folder that cannot be used; the message says what was found
    and what is expected."""


@dataclasses.dataclass
class Dataset:
    """A folder's annotations: `coco` (a COCO instances dict whose file_names are relative to
    `image_dir`), the `format` and `source` read, and the images `unlabelled` (not used);
    `notes`: what else the data line says (a YOLO reader's negatives and dropped labels)."""
    format: str
    source: str
    image_dir: str
    coco: dict
    unlabelled: int = 0
    val_dir: Optional[str] = None  # A YOLO data.yaml's own val: directory.
    notes: tuple = ()

    def line(self) -> str:
        """'COCO: instances.json, 120 photos, 3 classes, 2,410 boxes'."""
        left = (', %s without annotations left out' % _count(self.unlabelled, 'image')
                if self.unlabelled else '')
        return '%s: %s, %s, %s, %s%s%s' % (
            self.format, self.source, _count(len(self.coco['images']), 'photo'),
            _count(len(self.coco['categories']), 'class', 'classes'),
            _count(len(self.coco['annotations']), 'box', 'boxes'), left,
            ''.join(', ' + note for note in self.notes))


_count = stats.count


def _parse_error(path):
    """'path:LINE:COL: not valid JSON: ...' when the file does not parse, else None."""
    try:
        with open(path, 'rb') as stream:
            json.load(stream)
    except json.JSONDecodeError as error:
        return coco_annotations.json_error(path, error)
    except (OSError, ValueError):
        return None
    return None


def _is_coco_json(path):
    try:
        with open(path, 'rb') as stream:
            content = json.load(stream)
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and all(k in content for k in coco_annotations.REQUIRED_KEYS)


def _files(directory, extensions):
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.lower().endswith(extensions) and not name.startswith('.'))


def found_formats(folder) -> Dict[str, List[str]]:
    """{format: the files that show it} of a folder (empty lists dropped)."""
    jsons = _files(folder, ('.json',)) + _files(os.path.join(folder, 'annotations'), ('.json',))
    xmls = _files(folder, ('.xml',)) or _files(os.path.join(folder, 'Annotations'), ('.xml',))
    names = [os.path.join(folder, name) for name in NAMES_FILES
             if os.path.isfile(os.path.join(folder, name))]
    yolo = names if names and (os.path.isdir(os.path.join(folder, 'images')) or any(
        name.endswith(('.yaml', '.yml')) for name in names)) else []
    found = {'COCO': [path for path in jsons if _is_coco_json(path)], 'Pascal VOC': xmls,
             'YOLO': yolo}
    return {name: paths for name, paths in found.items() if paths}


def _check_jsons_parse(flag, folder, found):
    """A .json that does not parse may be the data set meant (or one of two): named with its
    parse error, unless the folder is plainly Pascal VOC or YOLO."""
    if found and 'COCO' not in found:
        return
    jsons = _files(folder, ('.json',)) + _files(os.path.join(folder, 'annotations'), ('.json',))
    broken = [error for error in map(_parse_error, jsons) if error]
    if broken:
        raise InputError('--%s=%s: %s%s' % (
            flag, folder, broken[0], '; or name the COCO JSON to use with --%s=FILE.json' % flag
            if len(jsons) > 1 else ''))


def _what_is_there(folder):
    images = len(_files(folder, IMAGE_EXTENSIONS))
    others = sorted({os.path.splitext(name)[1].lower() or name for name in os.listdir(folder)
                     if not name.startswith('.')} - set(IMAGE_EXTENSIONS))
    return '%s%s' % (_count(images, 'image'),
                     (' and ' + ', '.join(others[:6])) if others else '')


EXPECTED = ('a COCO JSON (images, annotations, categories) with its images, Pascal VOC .xml '
            'files with their images, or YOLO images/ + labels/ with classes.txt, obj.names '
            'or data.yaml')


def detect(flag, folder) -> tuple:
    """(format, files) of --flag=folder (a folder, or a COCO .json file); raises InputError
    when none or more than one format is there."""
    if os.path.isfile(folder) and folder.lower().endswith('.json'):
        broken = _parse_error(folder)
        if broken:
            raise InputError('--%s=%s' % (flag, broken))
        if not _is_coco_json(folder):
            raise InputError('--%s=%s is not a COCO instances JSON (no images, annotations '
                             'and categories lists)' % (flag, folder))
        return 'COCO', [folder]
    if not os.path.isdir(folder):
        raise InputError('--%s=%s does not exist; give the folder of your photos and their '
                         'annotations' % (flag, folder))
    found = found_formats(folder)
    _check_jsons_parse(flag, folder, found)
    if not found:
        raise InputError('--%s=%s holds %s, no annotations: expected %s'
                         % (flag, folder, _what_is_there(folder), EXPECTED))
    if len(found) > 1 or len(found.get('COCO', [])) > 1 or len(found.get('YOLO', [])) > 1:
        what = '; '.join('%s: %s' % (name, ', '.join(os.path.basename(p) for p in paths[:4]))
                         for name, paths in found.items())
        raise InputError('--%s=%s is ambiguous, it holds %s; keep one data set (one COCO JSON, '
                         'one names file) in the folder, or name the COCO JSON itself with '
                         '--%s=FILE.json' % (flag, folder, what, flag))
    (name, paths), = found.items()
    return name, paths


def _coco_image_dir(json_path, content):
    """Where the JSON's file_names resolve: beside it, images/, one folder up, ../images."""
    here = os.path.dirname(os.path.abspath(json_path))
    candidates = [here, os.path.join(here, 'images'), os.path.dirname(here),
                  os.path.join(os.path.dirname(here), 'images')]
    first = next((image['file_name'] for image in content['images']
                  if isinstance(image, dict) and isinstance(image.get('file_name'), str)), None)
    if first is None:
        return here
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, first)):
            return candidate
    raise InputError('image %r of %s is in none of %s; put the images beside the JSON or in '
                     'images/' % (first, json_path, ', '.join(candidates)))


def read_coco(json_path) -> Dataset:
    content = coco_annotations.load_coco_json(json_path)
    image_dir = _coco_image_dir(json_path, content)
    coco_annotations.read_dataset(json_path, image_dir)  # Every check of the converter.
    content, notes = _boxes_as_converted(content)
    return Dataset('COCO', os.path.basename(json_path), image_dir, content, notes=notes)


_LEFT_OUT = {'malformed': 'without a valid bbox', 'degenerate': 'of no width or height',
             'outside': 'wholly outside their photo'}


def _boxes_as_converted(content):
    """(content with the boxes the converter keeps, as it keeps them: one partly outside its
    photo clipped to it, the others left out (evaluation would count them unfound), the
    notes saying so with the first annotation id of each)."""
    sizes = {image['id']: (image['width'], image['height']) for image in content['images']}
    kept, left_out, clipped = [], {}, 0
    for annotation in content['annotations']:
        box, status = coco_annotations.clip_box(annotation.get('bbox'),
                                                *sizes[annotation['image_id']])
        if box is None:
            left_out.setdefault(status, []).append(annotation.get('id'))
            continue
        if status == 'clipped':
            ymin, xmin, ymax, xmax = box
            annotation, clipped = dict(annotation, bbox=[xmin, ymin, xmax - xmin, ymax - ymin],
                                       area=(xmax - xmin) * (ymax - ymin)), clipped + 1
        kept.append(annotation)
    notes = ['%s %s left out (annotation id %s%s)' % (
        _count(len(ids), 'box', 'boxes'), _LEFT_OUT[status], ids[0], ', ...' if ids[1:] else '')
        for status, ids in sorted(left_out.items())]
    if clipped:
        notes.append('%s partly outside the photo clipped to it' % _count(clipped, 'box', 'boxes'))
    return (dict(content, annotations=kept) if left_out or clipped else content), tuple(notes)


def _voc_image_dir(folder, xml_paths):
    xml_dir = os.path.dirname(xml_paths[0])
    first = voc_to_coco.parse_xml(xml_paths[0]).file_name
    for candidate in (xml_dir, folder, os.path.join(folder, 'JPEGImages'),
                      os.path.join(folder, 'images')):
        if os.path.isfile(os.path.join(candidate, first)):
            return candidate
    return xml_dir  # voc_to_coco.check_image names the missing image.


def read_voc(folder, xml_paths, single_class=None) -> Dataset:
    image_dir = _voc_image_dir(folder, xml_paths)
    images = [voc_to_coco.parse_xml(path) for path in xml_paths]
    for voc in images:
        voc_to_coco.check_image(voc, image_dir)
    used = {os.path.basename(voc.file_name) for voc in images}
    unlabelled = sum(1 for path in _files(image_dir, IMAGE_EXTENSIONS)
                     if os.path.basename(path) not in used)
    return Dataset('Pascal VOC', _count(len(xml_paths), 'XML file'), image_dir,
                   voc_to_coco.coco_dataset(images, single_class), unlabelled)


def read_yolo(folder, names_path, drop_orphan_labels=False) -> Dataset:
    if names_path.endswith(('.yaml', '.yml')):
        names, image_dir = yolo_to_coco.read_data_yaml(names_path, 'train')
        with open(names_path, encoding='utf-8') as stream:
            has_val = isinstance((yaml.safe_load(stream) or {}).get('val'), str)
        val_dir = yolo_to_coco.read_data_yaml(names_path, 'val')[1] if has_val else None
        if val_dir and os.path.normpath(val_dir) == os.path.normpath(image_dir):
            val_dir = None
    else:
        names, image_dir, val_dir = (yolo_to_coco.read_names_file(names_path),
                                     os.path.join(folder, 'images'), None)
    coco, counts = yolo_to_coco.read_dataset(image_dir, names, None, drop_orphan_labels,
                                             skip=[names_path])
    return Dataset('YOLO', os.path.basename(names_path), image_dir, coco, val_dir=val_dir,
                   notes=tuple(counts.notes()))


def read(flag, folder, single_class=None, drop_orphan_labels=False) -> Dataset:
    """The Dataset of --flag=folder (see the module docstring); raises UserError."""
    kind, paths = detect(flag, folder)
    if kind == 'COCO':
        dataset = read_coco(paths[0])
    elif kind == 'Pascal VOC':
        dataset = read_voc(folder, paths, single_class)
    else:
        dataset = read_yolo(folder, paths[0], drop_orphan_labels)
    if single_class and kind != 'Pascal VOC':
        dataset.coco = merge_classes(dataset.coco, single_class)
    if kind != 'YOLO':  # The YOLO reader says which have no label file and which an empty one.
        boxed = {annotation['image_id'] for annotation in dataset.coco['annotations']}
        negatives = sum(1 for image in dataset.coco['images'] if image['id'] not in boxed)
        if negatives:
            dataset.notes += ('%s without boxes (negatives)' % _count(negatives, 'photo'),)
    if not dataset.coco['images']:
        raise InputError('--%s=%s: %s lists no photos' % (flag, folder, dataset.source))
    return dataset


def merge_classes(coco, name) -> dict:
    """Every category merged into one, `name` (id 1), as voc_to_coco --single_class."""
    return dict(coco, categories=[{'id': 1, 'name': name}],
                annotations=[dict(a, category_id=1) for a in coco['annotations']])


def photo_name(image) -> str:
    return os.path.basename(image['file_name'])


def subset(coco, image_ids) -> dict:
    """The COCO dict of some of its images (their entries and annotations kept as they are)."""
    keep = set(image_ids)
    return dict(coco, images=[image for image in coco['images'] if image['id'] in keep],
                annotations=[a for a in coco['annotations'] if a['image_id'] in keep])


def hash_key(image) -> str:
    """The SHA-1 of a photo's file name: the order the split and the review's folds use."""
    return hashlib.sha1(photo_name(image).encode('utf-8')).hexdigest()


def _hash_order(images):
    return sorted(images, key=hash_key)


def _named(images, names, flag='val_photos'):
    """The images a --val_photos list names (file name, or file name without extension)."""
    by_name = {}
    for image in images:
        name = photo_name(image)
        by_name.setdefault(name, image)
        by_name.setdefault(os.path.splitext(name)[0], image)
    unknown = [name for name in names if name not in by_name]
    if unknown:
        there = ', '.join(sorted(photo_name(image) for image in images)[:8])
        raise InputError('--%s names %s, not a photo of --data (there: %s%s)' % (
            flag, ', '.join(unknown), there, ', ...' if len(images) > 8 else ''))
    return [by_name[name] for name in names]


def split(coco, val_photos: Sequence[str] = ()) -> tuple:
    """(train COCO dict, val COCO dict, how the val photos were chosen)."""
    images = coco['images']
    if val_photos:
        held = _named(images, val_photos)
        how = 'named by --val_photos'
    else:
        if len(images) < 2:
            raise InputError('--data holds one photo: nothing to hold out for validation; '
                             'give --val_data=DIR or more photos')
        count = min(VAL_MAX, max(1, int(round(VAL_FRACTION * len(images)))), len(images) - 1)
        held = _hash_order(images)[:count]
        how = 'held out by file name (sha1 order, %d%%)' % int(VAL_FRACTION * 100)
    held_ids = {image['id'] for image in held}
    if len(held_ids) == len(images):
        raise InputError('--val_photos names every photo of --data; leave some to train on')
    train_ids = [image['id'] for image in images if image['id'] not in held_ids]
    return subset(coco, train_ids), subset(coco, held_ids), how


def align_categories(train, val, where) -> dict:
    """val's annotations with train's category ids, matched by name; a class of val that
    train lacks is an error."""
    train_ids = {c['name']: c['id'] for c in train['categories']}
    val_names = {c['id']: c['name'] for c in val['categories']}
    used = {val_names[a['category_id']] for a in val['annotations']}
    unknown = sorted(used - set(train_ids))
    if unknown:
        raise InputError('%s has the classes %s, which --data does not (classes there: %s); '
                         'use the same class names' % (where, ', '.join(unknown),
                                                       ', '.join(sorted(train_ids))))
    return dict(val, categories=train['categories'], annotations=[
        dict(a, category_id=train_ids[val_names[a['category_id']]]) for a in val['annotations']])


def split_line(train, val, how) -> str:
    """'split by photo: 3 photos, 672 boxes to train; 1 photo, 279 boxes held out (...)'."""
    return 'split by photo: %s, %s to train; %s, %s to validate (%s)' % (
        _count(len(train['images']), 'photo'), _count(len(train['annotations']), 'box', 'boxes'),
        _count(len(val['images']), 'photo'), _count(len(val['annotations']), 'box', 'boxes'), how)
