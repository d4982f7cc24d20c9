"""datatools/synthetic_coco.py's options for the fine-tune benchmark's sets: photo and object
sizes, grey photos, 1 to 20 classes; the defaults still give the demo's data."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from efficientdet_hpu.datatools import synthetic_coco


def _load(paths, split='train'):
    with open(paths[split + '_annotations']) as stream:
        return json.load(stream)


def test_sizes_grey_and_one_class(tmp_path):
    look = synthetic_coco.Look(image_sides=(500, 600), object_sizes=(0.05, 0.1), max_objects=12,
                               grey=True)
    paths = synthetic_coco.generate(str(tmp_path), num_train=4, num_val=1, seed=5,
                                    num_classes=1, look=look)
    coco = _load(paths)
    assert [c['name'] for c in coco['categories']] == ['ellipse']
    for image in coco['images']:
        assert 500 <= image['width'] <= 600 and 500 <= image['height'] <= 600
        with Image.open(os.path.join(paths['train_image_dir'], image['file_name'])) as photo:
            assert photo.mode == 'L' and photo.size == (image['width'], image['height'])
    sides = [max(a['bbox'][2:]) for a in coco['annotations']]
    # The longer side is 5-10% of the shorter image side (500-600 px): 25-60 px, a pixel or
    # two of rasterising either way.
    assert sides and 20 <= min(sides) and max(sides) <= 62
    assert max(sum(a['image_id'] == i['id'] for a in coco['annotations'])
               for i in coco['images']) <= 12


def test_twenty_classes_are_shapes_in_five_colours(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path), num_train=30, num_val=0, seed=2,
                                    num_classes=20)
    coco = _load(paths)
    names = [c['name'] for c in coco['categories']]
    assert len(names) == 20 == len(set(names)) == len({c['id'] for c in coco['categories']})
    assert names[:5] == ['ellipse-red', 'rectangle-red', 'triangle-red', 'cross-red',
                         'ellipse-green']
    assert len({a['category_id'] for a in coco['annotations']}) > 10


def test_a_colour_class_is_painted_near_its_colour():
    palette = {0: (220, 40, 40)}
    rng = np.random.default_rng(3)
    pixels, objects = synthetic_coco.render_image(rng, 200, 200, 3, synthetic_coco.CATEGORIES[:1],
                                                  palette=palette)
    for obj in objects:
        assert np.all(np.abs(obj['colour'] - np.array(palette[0])) <= 20)


def test_too_many_classes_is_an_error():
    with pytest.raises(ValueError, match='num_classes=21: give 1 to 20'):
        synthetic_coco.categories_for(21)


def test_the_defaults_are_the_demos_data(tmp_path):
    synthetic_coco.generate(str(tmp_path / 'a'), num_train=3, num_val=1, seed=0)
    synthetic_coco.generate(str(tmp_path / 'b'), num_train=3, num_val=1, seed=0,
                            num_classes=4, look=synthetic_coco.Look())
    for name in ['annotations/instances_train.json'] + ['train/' + f for f in sorted(
            os.listdir(tmp_path / 'a' / 'train'))]:
        assert (tmp_path / 'a' / name).read_bytes() == (tmp_path / 'b' / name).read_bytes()
