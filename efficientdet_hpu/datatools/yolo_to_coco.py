r"""Turns a YOLO-format data set (images + one labels/*.txt per image) into one COCO instances
JSON, the input of the TFRecord converter.

    python -m efficientdet_hpu.datatools.yolo_to_coco --image_dir=/data/yolo/images/train \
        --names_file=/data/yolo/classes.txt --output_file=/data/yolo/train.json
    python -m efficientdet_hpu.datatools.yolo_to_coco --data_yaml=/data/yolo/data.yaml \
        --split=val --output_file=/data/yolo/val.json

Label files: one line per box, `class cx cy w h`, the class a 0-based index into the names,
the box centre and size as fractions of the image width and height. Which file belongs to an
image follows Ultralytics: the last `/images/` of the image's path becomes `/labels/` and the
extension `.txt` (no `images` directory in the path: the .txt beside the image); --label_dir
gives the root of the label tree instead. An image without a label file, or with an empty one,
is kept as a negative (Ultralytics' "backgrounds"), and both are counted. A label file whose image
is missing (any image extension) would lose its boxes: it is an error naming it, unless
--drop_orphan_labels leaves such files out (counted). Ultralytics lists the images and never
looks at such a file; no YOLO tool has a flag for it, hence this name.

Names: a classes.txt / obj.names file (one name per line), or an Ultralytics data.yaml whose
`names:` is a list or an {index: name} dict; its `train:` / `val:` directory (--split) is the
image directory, relative to its `path:` (itself relative to the YAML's directory; absent: the
YAML's directory); as in Ultralytics, a `../x` that does not exist is read as `x` (Roboflow's
exports). Category ids are class index + 1 (1..N), names in index order.

Boxes: COCO [x, y, w, h] = [(cx - w/2) * W, (cy - h/2) * H, w * W, h * H] in pixels of the
image as stored (W x H read from the file: the size the converter checks), clipped to the
image, rounded to 1/1000 pixel. Each value must lie in [0, 1] within TOLERANCE (values inside
it are clamped). Checks, each a one-line error `label_file:line: what; the fix` (exit 2,
nothing written): a line without 5 fields, a class id that is not an index of the names, a
value outside [0, 1], a zero-size box; an unreadable image; an image with an EXIF rotation (the
labels refer to the upright view, the converter stores the pixels as they are). The JSON is
written atomically.
"""
import dataclasses
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
import yaml

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.data import image_codec
from efficientdet_hpu.datatools import voc_to_coco

FLAGS = flags.FLAGS

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
TOLERANCE = 0.01  # Fractions of the image side; exporters write 1.0000001 and the like.
_FIELDS = ('cx', 'cy', 'w', 'h')


class YoloError(errors.UserError):
    """A label file, names file or image is unusable; the message names the file."""


@dataclasses.dataclass
class LabelCounts:
    """What read_dataset found besides the boxes: images without a label file and images
    with an empty one (both negatives), label files without an image (left out)."""
    without_label_file: int = 0
    empty_label_file: int = 0
    orphans: List[str] = dataclasses.field(default_factory=list)

    def notes(self) -> List[str]:
        """['2 images without boxes (1 without a label file, 1 with an empty one: negatives,
        as in YOLO)', '1 label file without an image left out']: the parts that are not 0."""
        found, negatives = [], self.without_label_file + self.empty_label_file
        parts = (['%d without a label file' % self.without_label_file]
                 if self.without_label_file else [])
        parts += ['%d with an empty one' % self.empty_label_file] if self.empty_label_file else []
        if negatives:
            found.append('%d image%s without boxes (%s: negatives, as in YOLO)' % (
                negatives, '' if negatives == 1 else 's', ', '.join(parts)))
        if self.orphans:
            found.append('%d label file%s without an image left out' % (
                len(self.orphans), '' if len(self.orphans) == 1 else 's'))
        return found


def read_names_file(path: str) -> List[str]:
    """Class names of a classes.txt / obj.names file: one per non-blank line, index order."""
    try:
        with open(path, encoding='utf-8') as stream:
            names = [line.strip() for line in stream if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise YoloError('--names_file=%s cannot be read (%s)' % (path, error)) from None
    if not names:
        raise YoloError('--names_file=%s holds no class names; write one name per line, '
                        'in class index order' % path)
    return names


def names_of_yaml(data: Dict, path: str) -> List[str]:
    """The `names:` of a data.yaml: a list, or a dict {0: name, 1: name, ...}."""
    names = data.get('names')
    if isinstance(names, dict):
        if sorted(names) != list(range(len(names))):
            raise YoloError('%s: names: has the indices %s; they must be 0..%d, one name each'
                            % (path, sorted(names), len(names) - 1))
        names = [names[index] for index in range(len(names))]
    if not isinstance(names, list) or not names:
        raise YoloError("%s: no 'names:' list or {index: name} dict; add the class names"
                        % path)
    if 'nc' in data and data['nc'] != len(names):
        raise YoloError('%s: nc: %s but names: has %d entries; make them agree'
                        % (path, data['nc'], len(names)))
    return [str(name) for name in names]


def read_data_yaml(path: str, split: str) -> Tuple[List[str], str]:
    """(class names, image directory of `split`) of an Ultralytics data.yaml."""
    try:
        with open(path, encoding='utf-8') as stream:
            data = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as error:
        raise YoloError('--data_yaml=%s cannot be read (%s)' % (path, error)) from None
    if not isinstance(data, dict):
        raise YoloError('--data_yaml=%s is not a mapping with names: and train:/val:' % path)
    names = names_of_yaml(data, path)
    entry = data.get(split)
    if not isinstance(entry, str):
        raise YoloError('%s: %s: is %r; give one image directory there, or pass '
                        '--image_dir=DIR' % (path, split, entry))
    root = os.path.join(os.path.dirname(os.path.abspath(path)), str(data.get('path') or ''))
    image_dir = os.path.normpath(os.path.join(root, entry))
    if not os.path.isdir(image_dir) and entry.startswith('../'):
        # Roboflow writes `train: ../train/images` beside train/; Ultralytics then drops '../'.
        image_dir = os.path.normpath(os.path.join(root, entry[3:]))
    return names, image_dir


def image_files(image_dir: str) -> List[str]:
    """Image paths under image_dir (any depth, any case of IMAGE_EXTENSIONS), sorted."""
    if not os.path.isdir(image_dir):
        raise YoloError('image directory %s does not exist; pass --image_dir=DIR or fix the '
                        'data.yaml entry' % image_dir)
    found = []
    for directory, subdirectories, names in os.walk(image_dir):
        subdirectories.sort()
        found.extend(os.path.join(directory, name) for name in names
                     if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith('.'))
    if not found:
        raise YoloError('no images (%s, any case) under %s' % (' '.join(IMAGE_EXTENSIONS),
                                                                image_dir))
    return sorted(found)


def label_path(image_path: str, image_dir: str, label_dir: Optional[str] = None) -> str:
    """The label file of an image: under label_dir mirroring image_dir, else Ultralytics'
    rule (last /images/ -> /labels/, extension -> .txt)."""
    stem = os.path.splitext(image_path)[0]
    if label_dir:
        return os.path.join(label_dir, os.path.relpath(stem, image_dir) + '.txt')
    images, labels = os.sep + 'images' + os.sep, os.sep + 'labels' + os.sep
    return labels.join(os.path.abspath(stem).rsplit(images, 1)) + '.txt'


def label_name(image_path: str, image_dir: str, label_dir: Optional[str] = None) -> str:
    """The label file of an image as it sits in its labels/ tree (label_id's file): x.txt for
    images/x.jpg, train/x.txt for Ultralytics' images/train/x.jpg."""
    stem = os.path.splitext(image_path)[0]
    images = os.sep + 'images' + os.sep
    if label_dir or images not in os.path.abspath(stem):
        name = os.path.relpath(stem, image_dir)
    else:
        name = os.path.abspath(stem).rsplit(images, 1)[1]
    return name.replace(os.sep, '/') + '.txt'


def _number(text: str, where: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise YoloError('%s: %s is %r, not a number; fix the line' % (where, name, text))
    return value


def parse_line(line: str, where: str, num_classes: int) -> Tuple[int, List[float]]:
    """(class index, [cx, cy, w, h] clamped to [0, 1]) of one label line."""
    fields = line.split()
    if len(fields) != 5:
        raise YoloError('%s: %d fields; a box line is `class cx cy w h` (5 fields, polygon '
                        'lines are not read); fix the line' % (where, len(fields)))
    class_value = _number(fields[0], where, 'the class')
    if class_value != int(class_value) or not 0 <= class_value < num_classes:
        raise YoloError('%s: class %s, but the %d class names give classes 0..%d; fix the '
                        'class id or add its name to the names file'
                        % (where, fields[0], num_classes, num_classes - 1))
    values = [_number(text, where, name) for text, name in zip(fields[1:], _FIELDS)]
    for value, name in zip(values, _FIELDS):
        if not -TOLERANCE <= value <= 1 + TOLERANCE:
            raise YoloError('%s: %s=%s is outside [0, 1]: YOLO boxes are fractions of the '
                            'image width and height; fix the box (pixel values must be '
                            'divided by the image size)' % (where, name, value))
    values = [min(max(value, 0.0), 1.0) for value in values]
    if values[2] == 0 or values[3] == 0:
        raise YoloError('%s: the box has zero width or height; remove the line' % where)
    return int(class_value), values


def coco_box(cx: float, cy: float, w: float, h: float, width: int, height: int) -> List[float]:
    """Normalised centre box -> COCO [x, y, w, h] pixels, clipped to the image, 1/1000 px."""
    xmin, xmax = max(0.0, (cx - w / 2) * width), min(float(width), (cx + w / 2) * width)
    ymin, ymax = max(0.0, (cy - h / 2) * height), min(float(height), (cy + h / 2) * height)
    return [round(xmin, 3), round(ymin, 3), round(xmax - xmin, 3), round(ymax - ymin, 3)]


def read_labels(path: str, num_classes: int, width: int, height: int,
                source: str = '') -> List[tuple]:
    """[(category_id, COCO box, 'source:line')] of one label file (`source` the name to give
    it, default its path); [] when it is absent or empty."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding='utf-8', errors='replace') as stream:
        lines = stream.read().splitlines()
    boxes = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            label, (cx, cy, w, h) = parse_line(line, '%s:%d' % (path, number), num_classes)
            boxes.append((label + 1, coco_box(cx, cy, w, h, width, height),
                          '%s:%d' % (source or path, number)))
    return boxes


def image_size(path: str) -> Tuple[int, int]:
    """(width, height) as stored; an EXIF rotation or mirroring is an error (see above)."""
    size = voc_to_coco.read_image_size(path, YoloError)
    orientation = image_codec.exif_orientation(path)
    if orientation != 1:
        raise YoloError('%s: EXIF orientation %s: the labels refer to the upright view but the '
                        'converter stores the pixels as they are, so the boxes would be '
                        'misplaced; %s' % (path, orientation, image_codec.UPRIGHT_FIX + 'labels'))
    return size


def _check_shared_labels(images: Sequence[str], labels: Sequence[str]) -> None:
    owner = {}
    for image, label in zip(images, labels):
        if label in owner:
            raise YoloError('%s and %s both read the label file %s; rename one of them'
                            % (owner[label], image, label))
        owner[label] = image


def convert(image_dir: str, names: Sequence[str], output_file: str,
            label_dir: Optional[str] = None, drop_orphan_labels: bool = False) -> Dict:
    """Reads and checks every image and label file, then writes the COCO JSON atomically;
    returns it."""
    coco = coco_dataset(image_dir, names, label_dir, drop_orphan_labels)
    atomic_file.write_json_atomically(output_file, coco)
    return coco


def coco_dataset(image_dir: str, names: Sequence[str], label_dir: Optional[str] = None,
                 drop_orphan_labels: bool = False) -> Dict:
    """The COCO instances dict of a YOLO image directory (every image and label file read and
    checked; nothing written)."""
    return read_dataset(image_dir, names, label_dir, drop_orphan_labels)[0]


def _looks_like_labels(path: str) -> bool:
    """A .txt that is empty or whose first non-blank line is 5 numbers: a label file, not
    notes."""
    try:
        with open(path, encoding='utf-8', errors='replace') as stream:
            fields = next((line for line in stream if line.strip()), '').split()
        return not fields or (len(fields) == 5 and all(math.isfinite(float(f)) for f in fields))
    except (OSError, ValueError):
        return False


def orphan_labels(image_dir: str, labels: Sequence[str], label_dir: Optional[str] = None,
                  skip: Sequence[str] = ()) -> List[str]:
    """The label files of the label tree that no image of image_dir reads, sorted. The tree:
    label_dir, else Ultralytics' labels/ twin of image_dir, else image_dir itself (labels
    beside the images: there only .txt files that look like labels count; `skip`: files that
    are not labels, such as the names file)."""
    root = os.path.dirname(label_path(os.path.join(image_dir, 'x.jpg'), image_dir, label_dir))
    beside = os.path.normpath(root) == os.path.normpath(os.path.abspath(image_dir))
    used = {os.path.normpath(path) for path in labels}
    skipped = {os.path.normpath(os.path.abspath(path)) for path in skip}
    found = []
    for directory, subdirectories, file_names in os.walk(root):
        subdirectories.sort()
        for name in file_names:
            path = os.path.normpath(os.path.join(directory, name))
            if (name.endswith('.txt') and not name.startswith('.') and path not in used
                    and path not in skipped and (not beside or _looks_like_labels(path))):
                found.append(path)
    return sorted(found)


def _orphan_error(orphans, image_dir):
    shown = ', '.join(orphans[:3]) + (' and %d more' % (len(orphans) - 3)
                                      if len(orphans) > 3 else '')
    return YoloError('%d label file%s without an image under %s (%s): %s boxes would be '
                     'lost; put the images back, delete the label files, or pass '
                     '--drop_orphan_labels to leave them out' % (
                         len(orphans), '' if len(orphans) == 1 else 's', image_dir, shown,
                         'its' if len(orphans) == 1 else 'their'))


def read_dataset(image_dir: str, names: Sequence[str], label_dir: Optional[str] = None,
                 drop_orphan_labels: bool = False, skip: Sequence[str] = ()) -> tuple:
    """(COCO instances dict, LabelCounts) of a YOLO image directory: every image and label
    file read and checked, nothing written. Label files without an image: a YoloError naming
    them, unless drop_orphan_labels (then counted)."""
    paths = image_files(image_dir)
    labels = [os.path.normpath(label_path(path, image_dir, label_dir)) for path in paths]
    _check_shared_labels(paths, labels)
    counts = LabelCounts(orphans=orphan_labels(image_dir, labels, label_dir, skip))
    if counts.orphans and not drop_orphan_labels:
        raise _orphan_error(counts.orphans, image_dir)
    entries = []
    for path, labels_file in zip(paths, labels):
        width, height = image_size(path)
        file_name = os.path.relpath(path, image_dir).replace(os.sep, '/')
        boxes = read_labels(labels_file, len(names), width, height,
                            label_name(path, image_dir, label_dir))
        if not boxes:
            if os.path.isfile(labels_file):
                counts.empty_label_file += 1
            else:
                counts.without_label_file += 1
        entries.append((file_name, width, height, boxes))
    categories = [{'id': index + 1, 'name': name} for index, name in enumerate(names)]
    return voc_to_coco.coco_instances(entries, categories), counts


def define_flags():
    flags.DEFINE_string('image_dir', None, 'Directory of the images (any depth; default: '
                        'the --split directory of --data_yaml).')
    flags.DEFINE_string('label_dir', None, 'Root of the label .txt files, mirroring '
                        '--image_dir (default: Ultralytics\' images/ -> labels/ rule).')
    flags.DEFINE_string('names_file', None, 'classes.txt / obj.names: one class name a line.')
    flags.DEFINE_string('data_yaml', None, 'Ultralytics data.yaml (names:, path:, train:, '
                        'val:), instead of --names_file.')
    flags.DEFINE_enum('split', 'train', ['train', 'val', 'test'],
                      'The data.yaml entry giving the image directory.')
    flags.DEFINE_string('output_file', None, 'The COCO instances JSON to write.')
    flags.DEFINE_bool('drop_orphan_labels', False, 'Leave out label files whose image is '
                      'missing (default: an error naming them, as their boxes would be lost).')
    flags.DEFINE_bool('verbose', False, 'Show the traceback of an error.')
    flags.mark_flags_as_required(['output_file'])


def _names_and_image_dir() -> Tuple[List[str], str]:
    if bool(FLAGS.names_file) == bool(FLAGS.data_yaml):
        raise YoloError('give the class names with --names_file=classes.txt or '
                        '--data_yaml=data.yaml (one of them)')
    if FLAGS.names_file:
        if not FLAGS.image_dir:
            raise YoloError('--names_file needs --image_dir=DIR (the images)')
        return read_names_file(FLAGS.names_file), FLAGS.image_dir
    names, image_dir = read_data_yaml(FLAGS.data_yaml, FLAGS.split)
    return names, FLAGS.image_dir or image_dir


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s' % argv[1:])
    try:
        names, image_dir = _names_and_image_dir()
        skip = [FLAGS.names_file] if FLAGS.names_file else []
        coco, counts = read_dataset(image_dir, names, FLAGS.label_dir, FLAGS.drop_orphan_labels,
                                    skip)
        atomic_file.write_json_atomically(FLAGS.output_file, coco)
    except YoloError as error:
        sys.exit(errors.fail('yolo_to_coco', error, FLAGS.verbose))
    boxed = {a['image_id'] for a in coco['annotations']}
    print('wrote %s: %d images (%d without boxes, kept as negatives), %d boxes, categories %s%s'
          % (FLAGS.output_file, len(coco['images']), len(coco['images']) - len(boxed),
             len(coco['annotations']), ', '.join(c['name'] for c in coco['categories']),
             '; ' + counts.notes()[-1] if counts.orphans else ''))


def entry_point():
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
