"""YOLO txt labels -> COCO JSON (datatools/yolo_to_coco.py), worked by hand on tiny label files
with real PNG/JPEG images written here; then the JSON through the TFRecord converter."""
import glob
import json
import os

import numpy as np
from PIL import Image
import pytest

from cli_runs import assert_one_line_error, run_python
from efficientdet_hpu.datatools import yolo_to_coco

NAMES = ['cat', 'dog', 'bird']


def _image(path, size, exif_orientation=None):
    """A real image file of size (width, height); the format follows the extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.RandomState(0).randint(0, 255, (size[1], size[0], 3), np.uint8)
    image = Image.fromarray(pixels)
    fmt = 'PNG' if path.suffix.lower() == '.png' else 'JPEG'
    if exif_orientation:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        image.save(str(path), fmt, exif=exif)
    else:
        image.save(str(path), fmt)


def _labels(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(''.join(line + '\n' for line in lines))


def _dataset(root, split='train'):
    """root/images/<split>/ and root/labels/<split>/ as Ultralytics lays them out.

    a.png 40x20: the boxes worked out in test_boxes_worked_by_hand.
    b.JPG 30x10: one box; c.jpeg 16x16: no label file; d.PNG 8x8: an empty label file;
    sub/e.jpg 10x10: one box, in a subdirectory."""
    images, labels = root / 'images' / split, root / 'labels' / split
    _image(images / 'a.png', (40, 20))
    _labels(labels / 'a.txt', [
        '0 0.5 0.5 0.5 0.5',        # x (0.5-0.25)*40=10, y (0.5-0.25)*20=5, w 20, h 10
        '2 0.125 0.75 0.25 0.5',    # x (0.125-0.125)*40=0, y (0.75-0.25)*20=10, w 10, h 10
        '1 0.5 0.5 1 1',            # the whole image
        '',                         # blank lines are skipped
        '0 0.3 0.3 0.2 0.2',        # x 0.2*40=7.999999999999999 -> 8.0 at 1/1000 px; y 4
        '0 0.05 0.5 0.2 0.2',       # x from (0.05-0.1)*40=-2, clipped to 0, to 6: w 6
        '1 0.5 0.5 1.005 1',        # w 1.005 is within the tolerance: clamped to 1
    ])
    _image(images / 'b.JPG', (30, 10))
    _labels(labels / 'b.txt', ['1 0.5 0.5 0.2 0.4'])  # x (0.5-0.1)*30=12, y 3, w 6, h 4
    _image(images / 'c.jpeg', (16, 16))
    _image(images / 'd.PNG', (8, 8))
    _labels(labels / 'd.txt', [])
    _image(images / 'sub' / 'e.jpg', (10, 10))
    _labels(labels / 'sub' / 'e.txt', ['2 0.25 0.25 0.5 0.5'])  # [0, 0, 5, 5]
    return images


def _names_file(root):
    path = root / 'classes.txt'
    path.write_text('cat\ndog\nbird\n\n')
    return path


def test_boxes_worked_by_hand(tmp_path):
    images = _dataset(tmp_path)
    out = tmp_path / 'out' / 'train.json'
    names = yolo_to_coco.read_names_file(str(_names_file(tmp_path)))
    coco = yolo_to_coco.convert(str(images), names, str(out))
    assert json.loads(out.read_text()) == coco
    assert coco['categories'] == [{'id': 1, 'name': 'cat'}, {'id': 2, 'name': 'dog'},
                                  {'id': 3, 'name': 'bird'}]
    # Sizes are read from the files; every extension and case is found, sub/ included.
    assert coco['images'] == [
        {'id': 1, 'file_name': 'a.png', 'width': 40, 'height': 20},
        {'id': 2, 'file_name': 'b.JPG', 'width': 30, 'height': 10},
        {'id': 3, 'file_name': 'c.jpeg', 'width': 16, 'height': 16},
        {'id': 4, 'file_name': 'd.PNG', 'width': 8, 'height': 8},
        {'id': 5, 'file_name': 'sub/e.jpg', 'width': 10, 'height': 10}]
    got = [(a['image_id'], a['category_id'], a['bbox'], a['area']) for a in coco['annotations']]
    assert got == [
        (1, 1, [10.0, 5.0, 20.0, 10.0], 200.0),
        (1, 3, [0.0, 10.0, 10.0, 10.0], 100.0),
        (1, 2, [0.0, 0.0, 40.0, 20.0], 800.0),
        (1, 1, [8.0, 4.0, 8.0, 4.0], 32.0),
        (1, 1, [0.0, 8.0, 6.0, 4.0], 24.0),
        (1, 2, [0.0, 0.0, 40.0, 20.0], 800.0),
        (2, 2, [12.0, 3.0, 6.0, 4.0], 24.0),
        (5, 3, [0.0, 0.0, 5.0, 5.0], 25.0)]
    assert [a['id'] for a in coco['annotations']] == list(range(1, 9))
    assert all(a['iscrowd'] == 0 for a in coco['annotations'])
    # c.jpeg (no label file) and d.PNG (an empty one) are negatives: images without boxes.
    assert {a['image_id'] for a in coco['annotations']} == {1, 2, 5}


def test_label_dir_mirrors_the_image_dir(tmp_path):
    _image(tmp_path / 'photos' / 'x.png', (20, 20))
    _labels(tmp_path / 'txt' / 'x.txt', ['1 0.5 0.5 0.5 0.5'])
    coco = yolo_to_coco.convert(str(tmp_path / 'photos'), NAMES, str(tmp_path / 'o.json'),
                                label_dir=str(tmp_path / 'txt'))
    assert [(a['category_id'], a['bbox']) for a in coco['annotations']] == [
        (2, [5.0, 5.0, 10.0, 10.0])]
    # Without images/ in the path and without --label_dir: the .txt beside the image.
    _labels(tmp_path / 'photos' / 'x.txt', ['0 0.25 0.25 0.5 0.5'])
    coco = yolo_to_coco.convert(str(tmp_path / 'photos'), NAMES, str(tmp_path / 'o.json'))
    assert [(a['category_id'], a['bbox']) for a in coco['annotations']] == [
        (1, [0.0, 0.0, 10.0, 10.0])]


@pytest.mark.parametrize('names_yaml', [
    'names: [cat, dog, bird]',
    'names:\n  0: cat\n  1: dog\n  2: bird',
    'nc: 3\nnames: {2: bird, 0: cat, 1: dog}',
])
def test_data_yaml_list_and_dict_names_and_splits(tmp_path, names_yaml):
    _dataset(tmp_path / 'set', 'train')
    _image(tmp_path / 'set' / 'images' / 'val' / 'v.png', (20, 10))
    _labels(tmp_path / 'set' / 'labels' / 'val' / 'v.txt', ['2 0.5 0.5 0.5 0.5'])
    data_yaml = tmp_path / 'data.yaml'
    data_yaml.write_text('path: set\ntrain: images/train\nval: images/val\n' + names_yaml)
    names, train_dir = yolo_to_coco.read_data_yaml(str(data_yaml), 'train')
    assert names == NAMES
    assert train_dir == str(tmp_path / 'set' / 'images' / 'train')
    names, val_dir = yolo_to_coco.read_data_yaml(str(data_yaml), 'val')
    coco = yolo_to_coco.convert(val_dir, names, str(tmp_path / 'val.json'))
    assert coco['images'] == [{'id': 1, 'file_name': 'v.png', 'width': 20, 'height': 10}]
    assert [(a['category_id'], a['bbox']) for a in coco['annotations']] == [
        (3, [5.0, 2.5, 10.0, 5.0])]


def test_roboflow_data_yaml_dot_dot_paths(tmp_path):
    # Roboflow's export: data.yaml beside train/images and train/labels, `train: ../train/images`;
    # Ultralytics reads a '../x' that does not exist as 'x'.
    _image(tmp_path / 'train' / 'images' / 'r.jpg', (20, 20))
    _labels(tmp_path / 'train' / 'labels' / 'r.txt', ['0 0.5 0.5 0.5 0.5'])
    (tmp_path / 'data.yaml').write_text(
        'train: ../train/images\nval: ../valid/images\nnc: 1\nnames: [cat]\n')
    names, train_dir = yolo_to_coco.read_data_yaml(str(tmp_path / 'data.yaml'), 'train')
    assert train_dir == str(tmp_path / 'train' / 'images')
    coco = yolo_to_coco.convert(train_dir, names, str(tmp_path / 'o.json'))
    assert [a['bbox'] for a in coco['annotations']] == [[5.0, 5.0, 10.0, 10.0]]


@pytest.mark.parametrize('text, message', [
    ('names: {0: cat, 2: bird}', 'names: has the indices [0, 2]; they must be 0..1'),
    ('nc: 4\nnames: [cat, dog, bird]', 'nc: 4 but names: has 3 entries'),
    ('train: images/train', "no 'names:' list"),
])
def test_bad_data_yaml(tmp_path, text, message):
    data_yaml = tmp_path / 'data.yaml'
    data_yaml.write_text('train: images/train\n' + text)
    with pytest.raises(yolo_to_coco.YoloError, match=message.replace('[', r'\[')):
        yolo_to_coco.read_data_yaml(str(data_yaml), 'train')


@pytest.mark.parametrize('line, message', [
    ('3 0.5 0.5 0.1 0.1', 'class 3, but the 3 class names give classes 0..2'),
    ('-1 0.5 0.5 0.1 0.1', 'class -1, but the 3 class names'),
    ('0.5 0.5 0.5 0.1 0.1', 'class 0.5, but'),
    ('0 1.2 0.5 0.1 0.1', 'cx=1.2 is outside [0, 1]'),
    ('0 0.5 -0.02 0.1 0.1', 'cy=-0.02 is outside [0, 1]'),
    ('0 0.5 0.5 0.1 1.5', 'h=1.5 is outside [0, 1]'),
    ('0 0.5 0.5 0.1', '4 fields; a box line is `class cx cy w h`'),
    ('0 0.5 0.5 0.1 0.1 0.9', '6 fields'),
    ('0 0.5 0.5 0 0.1', 'zero width or height'),
    ('0 0.5 abc 0.1 0.1', "cy is 'abc', not a number"),
])
def test_bad_label_line_is_named_by_file_and_line(tmp_path, line, message):
    images = tmp_path / 'images'
    _image(images / 'a.png', (40, 20))
    _labels(tmp_path / 'labels' / 'a.txt', ['0 0.5 0.5 0.5 0.5', line])
    out = tmp_path / 'o.json'
    with pytest.raises(yolo_to_coco.YoloError) as error:
        yolo_to_coco.convert(str(images), NAMES, str(out))
    assert str(error.value).startswith('%s:2: ' % (tmp_path / 'labels' / 'a.txt'))
    assert message in str(error.value)
    assert not out.exists()


def test_exif_rotation_is_refused_and_upright_size_is_the_stored_one(tmp_path):
    # As the converter does: sizes are the stored pixels' (what it checks the JSON against).
    _image(tmp_path / 'images' / 'up.jpg', (30, 20), exif_orientation=1)
    coco = yolo_to_coco.convert(str(tmp_path / 'images'), NAMES, str(tmp_path / 'o.json'))
    assert (coco['images'][0]['width'], coco['images'][0]['height']) == (30, 20)
    # Orientation 6 (shown rotated 90 degrees): labels drawn on the upright 20x30 view would
    # be misplaced on the stored 30x20 pixels the converter keeps.
    _image(tmp_path / 'images' / 'turned.jpg', (30, 20), exif_orientation=6)
    with pytest.raises(yolo_to_coco.YoloError, match='turned.jpg: EXIF orientation 6'):
        yolo_to_coco.convert(str(tmp_path / 'images'), NAMES, str(tmp_path / 'o2.json'))
    assert not (tmp_path / 'o2.json').exists()


def test_two_images_sharing_one_label_file(tmp_path):
    _image(tmp_path / 'images' / 'a.jpg', (8, 8))
    _image(tmp_path / 'images' / 'a.png', (8, 8))
    with pytest.raises(yolo_to_coco.YoloError, match='both read the label file'):
        yolo_to_coco.convert(str(tmp_path / 'images'), NAMES, str(tmp_path / 'o.json'))


def _yolo_command(*flags):
    return run_python(['-m', 'dataset.yolo_to_coco'] + list(flags), timeout=120)


def test_command_line_one_line_error_writes_nothing_then_succeeds(tmp_path):
    images = _dataset(tmp_path)
    _labels(tmp_path / 'labels' / 'train' / 'b.txt', ['0 0.5 0.5 0.2 0.4', '7 0.5 0.5 0.2 0.4'])
    out = tmp_path / 'train.json'
    flags = ['--image_dir=%s' % images, '--names_file=%s' % _names_file(tmp_path),
             '--output_file=%s' % out]
    line = assert_one_line_error(
        _yolo_command(*flags), 'class 7, but the 3 class names give classes 0..2',
        'fix the class id', starts_with='yolo_to_coco: error: %s:2: '
        % (tmp_path / 'labels' / 'train' / 'b.txt'))
    assert line
    assert not out.exists() and not glob.glob(str(tmp_path / '.train.json*'))
    _labels(tmp_path / 'labels' / 'train' / 'b.txt', ['1 0.5 0.5 0.2 0.4'])
    done = _yolo_command(*flags)
    assert done.returncode == 0, done.stdout
    assert ('5 images (2 without boxes, kept as negatives), 8 boxes, categories cat, dog, bird'
            in done.stdout)
    assert len(json.loads(out.read_text())['annotations']) == 8
    assert_one_line_error(_yolo_command('--image_dir=%s' % images, '--output_file=%s' % out),
                          '--names_file=classes.txt or --data_yaml=data.yaml')


def test_label_files_without_an_image_are_named_and_dropped_only_when_asked(tmp_path):
    """A label file whose image is gone would take its boxes with it: named, refused;
    --drop_orphan_labels leaves it out and counts it. Images without a label file and with
    an empty one are negatives, counted apart (c.jpeg and d.PNG of _dataset)."""
    images = _dataset(tmp_path)
    orphan = tmp_path / 'labels' / 'train' / 'sub' / 'gone.txt'
    _labels(orphan, ['0 0.5 0.5 0.2 0.2'])
    with pytest.raises(yolo_to_coco.YoloError) as raised:
        yolo_to_coco.read_dataset(str(images), NAMES)
    assert str(raised.value) == (
        '1 label file without an image under %s (%s): its boxes would be lost; put the images '
        'back, delete the label files, or pass --drop_orphan_labels to leave them out'
        % (images, orphan))
    coco, counts = yolo_to_coco.read_dataset(str(images), NAMES, drop_orphan_labels=True)
    assert len(coco['images']) == 5 and len(coco['annotations']) == 8
    assert (counts.without_label_file, counts.empty_label_file) == (1, 1)
    assert counts.orphans == [str(orphan)]
    assert counts.notes() == [
        '2 images without boxes (1 without a label file, 1 with an empty one: negatives, as '
        'in YOLO)', '1 label file without an image left out']
    # Labels beside the images: notes and the names file there are not label files.
    beside = tmp_path / 'beside'
    _image(beside / 'a.png', (20, 20))
    _labels(beside / 'a.txt', ['0 0.5 0.5 0.5 0.5'])
    _labels(beside / 'b.txt', ['1 0.5 0.5 0.5 0.5'])
    (beside / 'README.txt').write_text('Photos of the garden, 2024.\n')
    (beside / 'classes.txt').write_text('cat\ndog\nbird\n')
    assert yolo_to_coco.orphan_labels(str(beside), [str(beside / 'a.txt')],
                                      skip=[str(beside / 'classes.txt')]) == [
        str(beside / 'b.txt')]
    out = tmp_path / 'out.json'
    flags = ['--image_dir=%s' % images, '--names_file=%s' % _names_file(tmp_path),
             '--output_file=%s' % out]
    assert_one_line_error(_yolo_command(*flags), 'gone.txt): its boxes would be lost',
                          starts_with='yolo_to_coco: error: 1 label file without an image')
    assert not out.exists()
    done = _yolo_command(*flags + ['--drop_orphan_labels'])
    assert done.returncode == 0, done.stdout
    assert '; 1 label file without an image left out' in done.stdout


@pytest.mark.slow
def test_yolo_set_converts_to_tfrecords_end_to_end(tmp_path):
    """data.yaml -> COCO JSON (train and val) -> the TFRecord converter, on real files."""
    _dataset(tmp_path / 'set', 'train')
    _image(tmp_path / 'set' / 'images' / 'val' / 'v.png', (20, 10))
    _labels(tmp_path / 'set' / 'labels' / 'val' / 'v.txt', ['2 0.5 0.5 0.5 0.5'])
    data_yaml = tmp_path / 'set' / 'data.yaml'
    data_yaml.write_text('train: images/train\nval: images/val\nnames: [cat, dog, bird]\n')
    for split in ('train', 'val'):
        made = _yolo_command('--data_yaml=%s' % data_yaml, '--split=%s' % split,
                             '--output_file=%s' % (tmp_path / ('%s.json' % split)))
        assert made.returncode == 0, made.stdout
    converted = run_python([
        '-m', 'dataset.create_coco_tfrecord',
        '--image_dir=%s' % (tmp_path / 'set' / 'images' / 'train'),
        '--object_annotations_file=%s' % (tmp_path / 'train.json'),
        '--output_file_prefix=%s' % (tmp_path / 'records' / 'train'), '--num_shards=2',
        '--num_threads=1'], timeout=300)
    assert converted.returncode == 0, converted.stdout
    assert 'images written : 5 (negatives without boxes: 2' in converted.stdout
    assert 'boxes written  : 8 (crowd: 0, clipped to the image: 0)' in converted.stdout
    assert len(glob.glob(str(tmp_path / 'records' / 'train-?????-of-00002.tfrecord'))) == 2
    label_map = json.loads((tmp_path / 'records' / 'train-label_map.json').read_text())
    assert 'bird' in json.dumps(label_map) and 'cat' in json.dumps(label_map)
    verified = run_python(['-m', 'dataset.verify_tfrecords',
                           str(tmp_path / 'records' / 'train-*.tfrecord')], timeout=300)
    assert verified.returncode == 0, verified.stdout
    assert os.path.exists(tmp_path / 'val.json')
