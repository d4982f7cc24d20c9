"""Tests for dataset/synthetic_coco.py: determinism, COCO validity, box sanity, class balance."""
import json
import os

import numpy as np
from PIL import Image
from pycocotools.coco import COCO

from efficientdet_hpu.datatools import synthetic_coco


def _all_files(root):
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, 'rb') as handle:
                found[os.path.relpath(path, root)] = handle.read()
    return found


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    synthetic_coco.generate(str(tmp_path / 'a'), num_train=6, num_val=3, seed=0)
    synthetic_coco.generate(str(tmp_path / 'b'), num_train=6, num_val=3, seed=0)
    synthetic_coco.generate(str(tmp_path / 'c'), num_train=6, num_val=3, seed=1)
    first, second, other = (_all_files(tmp_path / name) for name in 'abc')
    assert len(first) == 6 + 3 + 2
    assert first == second
    common = set(first) & set(other)
    assert not common or all(first[name] != other[name] for name in common
                             if name.endswith('.json'))
    assert any(first[name] != other.get(name) for name in first if name.endswith('.jpg'))


def test_json_is_valid_coco_with_noncontiguous_ids(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path), num_train=12, num_val=4, seed=3)
    for split, count in (('train', 12), ('val', 4)):
        coco = COCO(paths[f'{split}_annotations'])
        assert sorted(coco.getCatIds()) == [3, 17, 42, 90]
        image_ids = sorted(coco.getImgIds())
        assert len(image_ids) == count
        assert image_ids[0] == synthetic_coco.FIRST_IMAGE_ID[split]
        assert image_ids[-1] - image_ids[0] > count - 1  # Gaps between ids.
        for image in coco.loadImgs(image_ids):
            with Image.open(os.path.join(paths[f'{split}_image_dir'], image['file_name'])) as pil:
                assert pil.size == (image['width'], image['height'])
                assert pil.mode == 'RGB' and pil.format == 'JPEG'
        annotation_ids = coco.getAnnIds()
        assert len(set(annotation_ids)) == len(annotation_ids)
    train_ids = set(COCO(paths['train_annotations']).getImgIds())
    assert not train_ids & set(COCO(paths['val_annotations']).getImgIds())


def test_boxes_lie_inside_images_and_sizes_vary(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path), num_train=30, num_val=0, seed=5)
    with open(paths['train_annotations']) as handle:
        content = json.load(handle)
    images = {image['id']: image for image in content['images']}
    assert len({(image['width'], image['height']) for image in images.values()}) > 10
    shorter_side_fractions = []
    for annotation in content['annotations']:
        image = images[annotation['image_id']]
        x, y, width, height = annotation['bbox']
        assert x >= 0 and y >= 0 and width > 0 and height > 0
        assert x + width <= image['width'] and y + height <= image['height']
        # The area is the shape's own pixels: at most its box, never a sliver of it.
        assert 0.2 * width * height <= annotation['area'] <= width * height
        shorter_side_fractions.append(max(width, height) / min(image['width'], image['height']))
    assert min(shorter_side_fractions) < 0.25 and max(shorter_side_fractions) > 0.4


def test_negatives_present_and_object_counts_in_range(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path), num_train=40, num_val=0, seed=0)
    coco = COCO(paths['train_annotations'])
    per_image = [len(coco.getAnnIds(imgIds=[image_id])) for image_id in coco.getImgIds()]
    assert per_image.count(0) == round(synthetic_coco.NEGATIVE_FRACTION * 40)
    assert max(per_image) <= synthetic_coco.MAX_OBJECTS
    assert len(set(per_image)) >= 3


def test_colour_does_not_reveal_class():
    colours = {index: [] for index in range(len(synthetic_coco.CATEGORIES))}
    for image_index in range(60):
        rng = np.random.default_rng([11, image_index])
        _, objects = synthetic_coco.render_image(rng, 200, 180, num_objects=4)
        for obj in objects:
            colours[obj['class_index']].append(obj['colour'])
    all_colours = np.concatenate([np.array(values) for values in colours.values()])
    for class_index, values in colours.items():
        values = np.array(values)
        assert len(values) >= 20, synthetic_coco.CATEGORIES[class_index]['name']
        # Every class comes in many distinct colours spanning most of the RGB cube...
        assert len({tuple(np.round(value, -1)) for value in values}) >= 15
        assert np.all(values.std(axis=0) > 40)
        # ...and its mean colour is no different from the other classes'.
        assert np.all(np.abs(values.mean(axis=0) - all_colours.mean(axis=0)) < 40)


def test_no_object_is_hidden_by_more_than_the_limit():
    drawn = 0
    for image_index in range(25):
        rng = np.random.default_rng([7, image_index])
        pixels, objects = synthetic_coco.render_image(rng, 240, 200, num_objects=5)
        assert pixels.shape == (200, 240, 3) and pixels.dtype == np.uint8
        for obj in objects:
            hidden = 1.0 - obj['visible_area'] / obj['area']
            assert hidden <= synthetic_coco.MAX_HIDDEN_FRACTION + 1e-9
        drawn += len(objects)
    assert drawn >= 25 * 4  # The limit rarely forces an object to be dropped.


def test_a_set_is_generated_once_for_its_key(tmp_path):
    """generated_once: made on the first call, reused for the same key (make not called, paths
    relative to the folder, so a moved folder reads its own), made again for another key or a
    marker of another form; an old marker of absolute paths still reads."""
    folder, made = str(tmp_path / 'set'), []

    def make():
        made.append(1)
        os.makedirs(folder, exist_ok=True)
        return {'annotations': os.path.join(folder, 'a.json'), 'image_dir': folder}
    first = synthetic_coco.generated_once(folder, ['x', 3], make)
    assert synthetic_coco.generated_once(folder, ('x', 3), make) == first and len(made) == 1
    with open(os.path.join(folder, 'generated.json')) as stream:
        assert json.load(stream) == {'key': ['x', 3], 'paths': {'annotations': 'a.json',
                                                                'image_dir': '.'}}
    os.rename(folder, str(tmp_path / 'moved'))
    assert synthetic_coco.generated_once(str(tmp_path / 'moved'), ['x', 3], make) == {
        'annotations': str(tmp_path / 'moved' / 'a.json'), 'image_dir': str(tmp_path / 'moved')}
    synthetic_coco.generated_once(folder, ['x', 4], make)
    assert len(made) == 2
    with open(os.path.join(folder, 'generated.json'), 'w') as stream:
        json.dump({'key': ['x', 4], 'paths': {'image_dir': '/elsewhere'}}, stream)
    assert synthetic_coco.generated_once(folder, ['x', 4], make) == {'image_dir': '/elsewhere'}
    for old in ({'image_dir': '.'}, {'key': ['x', 4], 'paths': folder}):  # No key; a string.
        with open(os.path.join(folder, 'generated.json'), 'w') as stream:
            json.dump(old, stream)
        synthetic_coco.generated_once(folder, ['x', 4], make)
    assert len(made) == 4
