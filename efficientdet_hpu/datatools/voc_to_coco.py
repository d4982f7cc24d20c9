r"""Turns Pascal VOC XML annotations (one XML per image) into one COCO instances JSON.

    python -m efficientdet_hpu.datatools.voc_to_coco --xml_dir=/data/trees/voc \
        --output_file=/data/trees/train.json --single_class=tree \
        [--image_dir=/data/trees/voc] [--include=OSBS_029,SOAP_061]

Box convention: VOC `<bndbox>` values are 1-based inclusive pixel indices (`xmin=1` is the
first pixel column, `xmax=width` the last), as in the VOC devkit. Pixel i (1-based) covers
[i - 1, i) in COCO's continuous coordinates, so a box becomes
    COCO [x, y, w, h] = [xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1]
and a box over the whole image is [0, 0, width, height].

Checks, each a one-line error naming the XML file (exit 2): unparsable XML or missing fields,
the image `<filename>` absent from --image_dir, `<size>` different from the image file's,
a box outside the image (xmin < 1 or xmax > width, same for y) or with xmax < xmin.
Categories: the sorted distinct `<name>`s get ids 1..N; --single_class=NAME merges them all into
one category NAME (id 1). Image ids are 1..M in XML file name order. The JSON is written
atomically (complete or absent).
"""
import dataclasses
import os
import sys
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional, Sequence

from absl import app
from absl import flags
from PIL import Image

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.data import image_codec

FLAGS = flags.FLAGS


class VocError(errors.UserError):
    """An XML file or its image is unusable; the message names the file."""


@dataclasses.dataclass(frozen=True)
class VocImage:
    """One parsed XML: the image file name, its size and its boxes.

    boxes: [(label, xmin, ymin, xmax, ymax)], VOC 1-based inclusive pixel indices."""
    xml_path: str
    file_name: str
    width: int
    height: int
    boxes: tuple


def _integer(element, field: str, xml_path: str) -> int:
    node = element.find(field)
    if node is None or node.text is None:
        raise VocError('%s: <%s> is missing; every image needs <size> and every object '
                       '<name> and <bndbox>' % (xml_path, field))
    try:
        return int(round(float(node.text)))
    except ValueError:
        raise VocError('%s: <%s> is %r, not a number' % (xml_path, field, node.text)) from None


def parse_xml(xml_path: str) -> VocImage:
    """Reads one VOC XML file; raises VocError for unreadable or unparsable files."""
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise VocError('%s: not readable as XML (%s); fix or remove the file' %
                       (xml_path, error)) from None
    name = root.findtext('filename')
    if not name:
        raise VocError('%s: <filename> is missing; it names the image file' % xml_path)
    width = _integer(root, 'size/width', xml_path)
    height = _integer(root, 'size/height', xml_path)
    boxes = []
    for index, obj in enumerate(root.iter('object')):
        label = (obj.findtext('name') or '').strip()
        if not label:
            raise VocError('%s: object %d has no <name>' % (xml_path, index))
        coords = [_integer(obj, 'bndbox/' + k, xml_path) for k in ('xmin', 'ymin', 'xmax', 'ymax')]
        _check_box(coords, width, height, '%s: object %d (%s)' % (xml_path, index, label))
        boxes.append((label, *coords))
    return VocImage(xml_path, name, width, height, tuple(boxes))


def _check_box(coords: Sequence[int], width: int, height: int, where: str) -> None:
    xmin, ymin, xmax, ymax = coords
    if xmax < xmin or ymax < ymin:
        raise VocError('%s: box xmin=%d ymin=%d xmax=%d ymax=%d has max < min; fix the box' %
                       (where, xmin, ymin, xmax, ymax))
    if xmin < 1 or ymin < 1 or xmax > width or ymax > height:
        raise VocError('%s: box xmin=%d ymin=%d xmax=%d ymax=%d is outside the %dx%d image '
                       '(VOC pixels are 1..width, 1..height); fix the box' %
                       (where, xmin, ymin, xmax, ymax, width, height))


def coco_box(xmin: int, ymin: int, xmax: int, ymax: int) -> List[int]:
    """VOC 1-based inclusive pixel indices -> COCO [x, y, w, h] (0-based, continuous)."""
    return [xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1]


def read_image_size(path: str, error_class=None, where: str = '') -> tuple:
    """(width, height) of the stored pixels, as the converter reads them (no EXIF rotation);
    an unreadable file raises error_class (default VocError) with `where` before the message."""
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, Image.DecompressionBombError) as error:
        raise (error_class or VocError)('%simage %s cannot be read (%s); fix or remove it' %
                                        (where, path, error)) from None


def check_image(voc: VocImage, image_dir: str) -> None:
    """Raises VocError when the image is missing or its size differs from the XML's <size>."""
    path = os.path.join(image_dir, voc.file_name)
    if not os.path.isfile(path):
        raise VocError('%s: image %r is not in --image_dir=%s; put it there or pass the '
                       'directory that holds it' % (voc.xml_path, voc.file_name, image_dir))
    size = read_image_size(path, VocError, voc.xml_path + ': ')
    if size != (voc.width, voc.height):
        orientation = image_codec.exif_orientation(path)
        if orientation in image_codec.EXIF_TRANSPOSING and size == (voc.height, voc.width):
            raise VocError('%s: <size> says %dx%d, the upright view of %s (EXIF orientation %d), '
                           'whose pixels are stored %dx%d, so the boxes would be misplaced; %s'
                           % (voc.xml_path, voc.width, voc.height, path, orientation, size[0],
                              size[1], image_codec.UPRIGHT_FIX + 'XML'))
        raise VocError('%s: <size> says %dx%d but %s is %dx%d; fix the XML <size>' %
                       (voc.xml_path, voc.width, voc.height, path, size[0], size[1]))


def coco_instances(images: Sequence[tuple], categories: Sequence[Dict]) -> Dict:
    """The COCO instances dict of images [(file_name, width, height, [(category_id, [x, y,
    w, h][, source]), ...])]: image ids 1..M and annotation ids 1..K in the given order. A
    box's `source` (its place in the input, 'a.xml:0', 'a.txt:3') is kept as the annotation's
    'source', so a tool reading the COCO JSON can name the input's own label."""
    coco = {'images': [], 'annotations': [], 'categories': list(categories)}
    for image_id, (file_name, width, height, boxes) in enumerate(images, start=1):
        coco['images'].append({'id': image_id, 'file_name': file_name,
                               'width': width, 'height': height})
        for category_id, box, *source in boxes:
            coco['annotations'].append({
                'id': len(coco['annotations']) + 1, 'image_id': image_id,
                'category_id': category_id, 'bbox': box,
                'area': round(box[2] * box[3], 6), 'iscrowd': 0})
            if source:
                coco['annotations'][-1]['source'] = source[0]
    return coco


def coco_dataset(images: Sequence[VocImage], single_class: Optional[str] = None) -> Dict:
    """The COCO instances dict of parsed XMLs (image ids 1..M in the given order)."""
    names = sorted({box[0] for voc in images for box in voc.boxes})
    if single_class:
        category_of = {name: 1 for name in names}
        categories = [{'id': 1, 'name': single_class}]
    else:
        category_of = {name: i + 1 for i, name in enumerate(names)}
        categories = [{'id': i, 'name': name} for name, i in category_of.items()]
    return coco_instances(
        [(voc.file_name, voc.width, voc.height,
          [(category_of[label], coco_box(*coords),
            '%s:%d' % (os.path.basename(voc.xml_path), index))
           for index, (label, *coords) in enumerate(voc.boxes)])
         for voc in images], categories)


def xml_files(xml_dir: str, include: Sequence[str] = ()) -> List[str]:
    """The XML paths in xml_dir (sorted), only the stems in `include` when it is given."""
    if not os.path.isdir(xml_dir):
        raise VocError('--xml_dir=%s is not a directory' % xml_dir)
    stems = sorted(f[:-4] for f in os.listdir(xml_dir) if f.lower().endswith('.xml'))
    missing = sorted(set(include) - set(stems))
    if missing:
        raise VocError('--include names %s, which have no XML in --xml_dir=%s (there: %s)' %
                       (', '.join(missing), xml_dir, ', '.join(stems) or 'none'))
    chosen = [s for s in stems if not include or s in include]
    if not chosen:
        raise VocError('--xml_dir=%s holds no .xml files' % xml_dir)
    return [os.path.join(xml_dir, s + '.xml') for s in chosen]


def convert(xml_dir: str, output_file: str, image_dir: Optional[str] = None,
            single_class: Optional[str] = None, include: Sequence[str] = ()) -> Dict:
    """Parses and checks every XML, then writes the COCO JSON atomically; returns it."""
    images = [parse_xml(path) for path in xml_files(xml_dir, include)]
    for voc in images:
        check_image(voc, image_dir or xml_dir)
    coco = coco_dataset(images, single_class)
    atomic_file.write_json_atomically(output_file, coco)
    return coco


def define_flags():
    flags.DEFINE_string('xml_dir', None, 'Directory of Pascal VOC XML files.')
    flags.DEFINE_string('image_dir', None, 'Directory of the images (default: --xml_dir).')
    flags.DEFINE_string('output_file', None, 'The COCO instances JSON to write.')
    flags.DEFINE_string('single_class', None, 'Merge every label into this one category.')
    flags.DEFINE_list('include', [], 'Only these XML file stems (a split by photo).')
    flags.DEFINE_bool('verbose', False, 'Show the traceback of an error.')
    flags.mark_flags_as_required(['xml_dir', 'output_file'])


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s' % argv[1:])
    try:
        coco = convert(FLAGS.xml_dir, FLAGS.output_file, FLAGS.image_dir, FLAGS.single_class,
                       FLAGS.include)
    except VocError as error:
        sys.exit(errors.fail('voc_to_coco', error, FLAGS.verbose))
    print('wrote %s: %d images, %d boxes, categories %s' % (
        FLAGS.output_file, len(coco['images']), len(coco['annotations']),
        ', '.join(c['name'] for c in coco['categories'])))


def entry_point():
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
