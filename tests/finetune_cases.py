"""Data for the finetune tests (tests/finetune/): tiny COCO, Pascal VOC and YOLO folders of
real images, and data statistics whose plan is worked out by hand in test_plan.py."""
import json
import os

from PIL import Image

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


ROOMY = plan_lib.Hardware(cores=2, memory_gb=20.0)


def grid(size, side, count):
    """`count` boxes of side x side px along the diagonal of a size x size photo."""
    step = (size - side) // max(1, count - 1)
    return tuple((i * step, i * step, side, side) for i in range(count))


# An orthophoto like deepforest's: one 2400 px training photo with 40 px crowns, a 1200 x
# 1000 validation photo.
ORTHO = stats.DataStats(train=(Photo(2400, 2400, grid(2400, 40, 10)),),
                        val=(Photo(1200, 1000, grid(1000, 40, 5)),), num_classes=1)
