"""Data for the finetune tests (tests/finetune/): tiny COCO, Pascal VOC and YOLO folders of
real images, and data statistics whose plan is worked out by hand in test_plan.py."""
import dataclasses
import json
import os

from PIL import Image

from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.finetune.stats import Photo

VOC_XML = ('<annotation><filename>{name}</filename><size><width>64</width><height>48</height>'
           '</size>{objects}</annotation>')
VOC_OBJECT = ('<object><name>{label}</name><bndbox><xmin>5</xmin><ymin>5</ymin><xmax>20</xmax>'
              '<ymax>20</ymax></bndbox></object>')


def photo(path, size=(64, 48)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new('RGB', size, (80, 90, 100)).save(path)


def make_coco(folder, count=3):
    os.makedirs(folder, exist_ok=True)
    images = [{'id': 10 + i, 'file_name': 'p%d.jpg' % i, 'width': 64, 'height': 48}
              for i in range(count)]
    for image in images:
        photo(os.path.join(folder, image['file_name']))
    coco = {'images': images, 'categories': [{'id': 7, 'name': 'cat'}],
            'annotations': [{'id': i + 1, 'image_id': 10 + i, 'category_id': 7,
                             'bbox': [4, 4, 20, 10], 'area': 200, 'iscrowd': 0}
                            for i in range(count)]}
    with open(os.path.join(folder, 'instances.json'), 'w') as stream:
        json.dump(coco, stream)
    return folder


def make_voc(folder, labels=('Tree', 'Dead')):
    os.makedirs(folder, exist_ok=True)
    for i, label in enumerate(labels):
        photo(os.path.join(folder, 'v%d.png' % i))
        with open(os.path.join(folder, 'v%d.xml' % i), 'w') as stream:
            stream.write(VOC_XML.format(name='v%d.png' % i,
                                        objects=VOC_OBJECT.format(label=label)))
    photo(os.path.join(folder, 'unlabelled.png'))
    return folder


def make_yolo(folder, names_file='classes.txt', count=3):
    for i in range(count):
        photo(os.path.join(folder, 'images', 'y%d.jpg' % i))
        os.makedirs(os.path.join(folder, 'labels'), exist_ok=True)
        with open(os.path.join(folder, 'labels', 'y%d.txt' % i), 'w') as stream:
            stream.write('%d 0.5 0.5 0.25 0.25\n' % (i % 2))
    with open(os.path.join(folder, names_file), 'w') as stream:
        stream.write('ant\nbee\n')
    return folder


ROOMY = plan_lib.Hardware(cores=2, memory_gb=20.0, cpu='test CPU')
# A cost table with round numbers, so that the plans of tests/finetune/test_plan.py can be
# worked out by hand: Lite0 trains 40, 24, 15 and 10 images/s at 128, 192, 256 and 320 px,
# every process starts in 30 s; an evaluation costs 2 s plus its images at 3 times the
# training rate; the converter 5 s a split plus 20 images/s, the doctor 20 s; the whole photos
# 20 s a run (as they are and with their flips) plus 3 passes of their images, the analysis
# 10 s, the export 60 s.
TABLE = costs.Table('test CPU', 2, 'today', (
    costs.Rate('efficientdet-lite0', 128, 40.0, 30.0),
    costs.Rate('efficientdet-lite0', 192, 24.0, 30.0),
    costs.Rate('efficientdet-lite0', 256, 15.0, 30.0),
    costs.Rate('efficientdet-lite0', 320, 10.0, 30.0),
    costs.Rate('efficientdet-d0', 512, 1.13, 30.0)),
    evaluation_fixed_seconds=2.0, inference_speedup=3.0, convert_seconds=5.0,
    convert_images_per_second=20.0, doctor_seconds=20.0, predict_seconds=20.0,
    analysis_seconds=10.0, export_seconds=60.0, source='tests')
# The same, with the search's random start (model_choice.RANDOM_START_MODEL, D0) measured at
# 192 px at Lite0's rate there (as on the 2-core CPU at 128 px): its trial costs what Lite0's
# would, so the searches of test_sizing.py and test_search.py keep their numbers.
SEARCH_TABLE = dataclasses.replace(TABLE, rates=TABLE.rates + (
    costs.Rate('efficientdet-d0', 192, 24.0, 30.0),))


def grid(size, side, count):
    """`count` boxes of side x side px along the diagonal of a size x size photo."""
    step = (size - side) // max(1, count - 1)
    return tuple((i * step, i * step, side, side) for i in range(count))


# An orthophoto like deepforest's: one 2400 px training photo with 40 px crowns, a 1200 x
# 1000 validation photo.
ORTHO = stats.DataStats(train=(Photo(2400, 2400, grid(2400, 40, 10)),),
                        val=(Photo(1200, 1000, grid(1000, 40, 5)),), num_classes=1)


def photos(count, width, height, sides):
    """`count` photos of width x height px, each with square boxes of `sides` px."""
    return tuple(Photo(width, height, tuple((10 * i, 10 * i, side, side)
                                            for i, side in enumerate(sides)))
                 for _ in range(count))


# The case: 600 photos of 340 x 300 px, boxes of 20, 40 and 60 px, 120 to validate.
SMALL_PHOTOS = stats.DataStats(photos(600, 340, 300, (20, 40, 60)),
                               photos(120, 340, 300, (20, 40, 60)), 4)
# Few photos: 40 of 640 x 480 px with boxes of 160 and 240 px (a third and half the photo).
FEW_PHOTOS = stats.DataStats(photos(40, 640, 480, (160, 240)), photos(10, 640, 480, (160,)), 2)
# Many classes and photos: 2000 photos of 256 px with a 64 px box, 200 to validate, 20 classes.
MANY_CLASSES = stats.DataStats(photos(2000, 256, 256, (64,)), photos(200, 256, 256, (64,)), 20)
LITE0_PTH = plan_lib.Weights('backbone', '/w/efficientnet-lite0.pth', 'efficientdet-lite0')
